//! `cheetah bench --xdp --xdp-katran OBJECT`: Katran itself beside cheetah, in the same run
//! and by the same method.
//!
//! OBJECT is Katran's own XDP program (`katran/lib/bpf/balancer.bpf.c` of
//! facebookincubator/katran, built outside this repository by `scripts/katran-build.sh`
//! with the flags of Katran's `Makefile-bpf`); nothing of Katran's code is in this
//! repository. This module loads it and fills its maps the way Katran's userspace would for
//! one VIP (`vip_map`, `reals`, the VIP's consistent-hash ring in `ch_rings`, the default
//! router's MAC in `ctl_array`, one LRU connection table per CPU in `lru_mapping`), then
//! times `balancer_ingress` under `BPF_PROG_TEST_RUN` with repeat = 1, which hands every
//! run a fresh copy of the frame, so Katran runs unwrapped. What it is net of is
//! `bench_bare_tx` (bpf/xdp_bench.c), a bare `XDP_TX` without the frame copy; and
//! cheetah's established path is timed the same way, unwrapped (`bench_lb_bare`), in the
//! same rounds, so the two columns compare like for like. Runs alternate subject and bare
//! program, as the other rows' do.
//!
//! Every row is checked against Katran's own counters (its `stats` map): a row whose
//! frames did not take the path it names is void.

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path as FilePath;

use anyhow::{ensure, Context};
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::wire::tcp::flags;
use cheetah_daemon::dataplane::xdp_layout::STAT_FAST_CLIENT_COOKIE;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType, Object, ObjectBuilder};

use super::xdp::{self, program, Bench, Path, Ports, Spread, Timings, WARM_UP_RUNS};

/// Katran's `RING_SIZE` (balancer_consts.h): slots of one VIP's consistent-hash ring.
const RING_SIZE: u32 = 65_537;
/// Katran's `MAX_VIPS` (balancer_consts.h): where its global counters start in `stats`.
const MAX_VIPS: u32 = 512;
/// Offsets of Katran's global counters in `stats` (balancer_consts.h).
const LRU_CNTRS: u32 = 0;
const LRU_MISS_CNTR: u32 = 1;
const NEW_CONN_RATE_CNTR: u32 = 2;
/// `vip_meta.flags`: skip the connection table (balancer_consts.h `F_LRU_BYPASS`).
const F_LRU_BYPASS: u32 = 1 << 1;
/// Katran's struct sizes for IPv4 (balancer_structs.h), checked against the object's maps.
const VIP_DEFINITION_SIZE: u32 = 20;
const VIP_META_SIZE: u32 = 8;
const REAL_DEFINITION_SIZE: u32 = 20;
const CTL_VALUE_SIZE: u32 = 8;
/// The default router's MAC: every packet Katran encapsulates goes to it.
const ROUTER_MAC: [u8; 6] = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x02];
/// Where the reals are (IPIP tunnel endpoints): 10.0.1.1 and up.
const FIRST_REAL: u32 = 0x0a00_0101;

/// One row of the Katran table: the subject's and the bare program's per-run times, and
/// the per-pair difference (the subject's own cost), or why the row is void.
pub struct KatranRow {
    pub label: String,
    pub result: Result<(Spread, Spread, Spread), String>,
}

/// Katran's program with its maps filled for one VIP over `reals` reals.
struct Katran {
    object: Object,
    /// Possible CPUs: the per-CPU maps' value count.
    cpus: usize,
}

impl Katran {
    fn load(path: &FilePath, reals: u16) -> anyhow::Result<Self> {
        let object = ObjectBuilder::default()
            .open_file(path)
            .with_context(|| format!("cannot open Katran's object {}", path.display()))?
            .load()
            .with_context(|| format!("the kernel refused Katran's object {}", path.display()))?;
        let katran = Katran {
            object,
            cpus: libbpf_rs::num_possible_cpus()?,
        };
        katran.check_sizes()?;
        katran.fill(reals)?;
        Ok(katran)
    }

    fn map(&self, name: &str) -> anyhow::Result<libbpf_rs::Map<'_>> {
        self.object
            .maps()
            .find(|m| m.name() == name)
            .with_context(|| format!("Katran's object has no map {name}: not balancer.bpf.c?"))
    }

    /// The structs this module writes are Katran's as of the commit the build script
    /// pins; a Katran whose layouts moved is refused, not misread.
    fn check_sizes(&self) -> anyhow::Result<()> {
        for (name, key, value) in [
            ("vip_map", VIP_DEFINITION_SIZE, VIP_META_SIZE),
            ("reals", 4, REAL_DEFINITION_SIZE),
            ("ch_rings", 4, 4),
            ("ctl_array", 4, CTL_VALUE_SIZE),
        ] {
            let map = self.map(name)?;
            ensure!(
                map.key_size() == key && map.value_size() == value,
                "Katran's {name} has {}-byte keys and {}-byte values, not {key} and {value}: another Katran version than scripts/katran-build.sh builds",
                map.key_size(),
                map.value_size()
            );
        }
        let ring = self.map("ch_rings")?.max_entries();
        ensure!(
            ring == MAX_VIPS * RING_SIZE,
            "Katran's ch_rings has {ring} entries, not MAX_VIPS * RING_SIZE = {}",
            MAX_VIPS * RING_SIZE
        );
        Ok(())
    }

    /// VIP 0 is the bench's VIP (TCP); its ring spreads over `reals` reals (ids from 1, as
    /// Katran numbers them); one LRU connection table per possible CPU, shaped as the
    /// object's template (its fallback_cache has the same key and value).
    fn fill(&self, reals: u16) -> anyhow::Result<()> {
        self.set_vip_flags(0)?;
        let reals_map = self.map("reals")?;
        for real in 1..=u32::from(reals) {
            let mut value = [0u8; REAL_DEFINITION_SIZE as usize];
            value[..4].copy_from_slice(&(FIRST_REAL + real - 1).to_be_bytes());
            reals_map
                .update(&real.to_ne_bytes(), &value, MapFlags::ANY)
                .context("cannot write Katran's reals")?;
        }
        let ring = self.map("ch_rings")?;
        for slot in 0..RING_SIZE {
            let real = 1 + slot % u32::from(reals);
            ring.update(&slot.to_ne_bytes(), &real.to_ne_bytes(), MapFlags::ANY)
                .context("cannot write Katran's ch_rings")?;
        }
        let mut mac = [0u8; CTL_VALUE_SIZE as usize];
        mac[..6].copy_from_slice(&ROUTER_MAC);
        self.map("ctl_array")?
            .update(&0u32.to_ne_bytes(), &mac, MapFlags::ANY)
            .context("cannot write Katran's ctl_array")?;
        let template = self.map("fallback_cache")?;
        let lru_mapping = self.map("lru_mapping")?;
        let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        for cpu in 0..self.cpus as u32 {
            let lru = MapHandle::create(
                MapType::LruHash,
                Some(format!("katran_lru_{cpu}")),
                template.key_size(),
                template.value_size(),
                template.max_entries(),
                &opts,
            )
            .context("cannot create a per-CPU LRU for Katran")?;
            lru_mapping
                .update(
                    &cpu.to_ne_bytes(),
                    &lru.as_fd().as_raw_fd().to_ne_bytes(),
                    MapFlags::ANY,
                )
                .context("cannot put an LRU into Katran's lru_mapping")?;
        }
        Ok(())
    }

    fn set_vip_flags(&self, vip_flags: u32) -> anyhow::Result<()> {
        let vip = testkit::VIP;
        let mut key = [0u8; VIP_DEFINITION_SIZE as usize];
        key[..4].copy_from_slice(&vip.to_be_bytes());
        key[16..18].copy_from_slice(&testkit::VIP_PORT.to_be_bytes());
        key[18] = 6; // IPPROTO_TCP
        let mut meta = [0u8; VIP_META_SIZE as usize];
        meta[..4].copy_from_slice(&vip_flags.to_ne_bytes());
        // vip_num 0: the first ring of ch_rings.
        self.map("vip_map")?
            .update(&key, &meta, MapFlags::ANY)
            .context("cannot write Katran's vip_map")
    }

    /// Katran's global counter `index` (its `v1` or `v2` word), summed over the CPUs.
    fn counter(&self, index: u32, second: bool) -> anyhow::Result<u64> {
        let values = self
            .map("stats")?
            .lookup_percpu(&(MAX_VIPS + index).to_ne_bytes(), MapFlags::ANY)
            .context("cannot read Katran's stats")?
            .unwrap_or_default();
        let at = if second { 8 } else { 0 };
        Ok(values
            .iter()
            .map(|v| u64::from_ne_bytes(v[at..at + 8].try_into().unwrap()))
            .sum())
    }

    /// Empties the new-connection rate counter, so that no SYN of the bench counts as a
    /// flood (over MAX_CONN_RATE a second, Katran skips the LRU insert).
    fn forget_connection_rate(&self) -> anyhow::Result<()> {
        let zero = vec![vec![0u8; 16]; self.cpus];
        self.map("stats")?
            .update_percpu(
                &(MAX_VIPS + NEW_CONN_RATE_CNTR).to_ne_bytes(),
                &zero,
                MapFlags::ANY,
            )
            .context("cannot reset Katran's connection rate")
    }
}

/// Katran's rows and cheetah's established path timed the same way, in one run: `bench`
/// is cheetah's l2 setup (its bare programs and frames).
pub fn rows(
    object: &FilePath,
    bench: &Bench,
    ports: &Ports,
    runs: u32,
    reals: u16,
) -> anyhow::Result<Vec<KatranRow>> {
    let katran = Katran::load(object, reals)?;
    let (ack, _) = bench.frame(Path::ClientToServer)?;
    let (client, client_port) = xdp::frame_client();
    let syn = TcpFrame::from_client(
        client,
        client_port,
        flags::SYN,
        options::linux_syn(0x0102_0304, 0),
    )
    .build();
    let ingress = ports.servers.ifindex;
    let bare = program(bench.program.object(), "bench_bare_tx")?;
    let cheetah = program(bench.program.object(), "bench_lb_bare")?;
    let balancer = katran
        .object
        .progs_mut()
        .find(|p| p.name() == "balancer_ingress")
        .context("Katran's object has no balancer_ingress")?;
    let mut rows = Vec::new();

    let time = |subject: &libbpf_rs::ProgramMut<'_>,
                frame: &[u8],
                before_run: &dyn Fn() -> anyhow::Result<()>| {
        xdp::time_against(
            subject,
            &bare,
            frame,
            ingress,
            runs,
            xdp::XDP_TX,
            before_run,
        )
    };
    let result = |(timings, wrong): (Timings, Option<u32>),
                  void: Option<String>|
     -> Result<(Spread, Spread, Spread), String> {
        if let Some(action) = wrong {
            return Err(format!("void: action {action}, not XDP_TX"));
        }
        if let Some(void) = void {
            return Err(void);
        }
        Ok(timings.spreads())
    };
    let nothing = || Ok(());

    // cheetah's own path, unwrapped like Katran's: the program the daemon attaches.
    let before = xdp::stat(bench.program.object(), STAT_FAST_CLIENT_COOKIE)?;
    let timed = time(&cheetah, &ack, &nothing)?;
    let moved = xdp::stat(bench.program.object(), STAT_FAST_CLIENT_COOKIE)? - before;
    let total = u64::from(WARM_UP_RUNS + runs);
    rows.push(KatranRow {
        label: "cheetah: established client->server (l2), by cookie".into(),
        result: result(
            timed,
            (moved != total).then(|| format!("void: {moved} of {total} runs took the cookie path")),
        ),
    });

    // Katran's established packet: its per-CPU LRU knows the flow after the first run.
    let misses = katran.counter(LRU_MISS_CNTR, true)?;
    let timed = time(&balancer, &ack, &nothing)?;
    let missed = katran.counter(LRU_MISS_CNTR, true)? - misses;
    rows.push(KatranRow {
        label: "Katran: established client->server, LRU hit, IPIP".into(),
        result: result(
            timed,
            (missed > 1).then(|| format!("void: {missed} runs missed the LRU")),
        ),
    });

    // The same packet with the VIP's connection table off: the ring alone.
    katran.set_vip_flags(F_LRU_BYPASS)?;
    let seen = katran.counter(LRU_CNTRS, false)?;
    let timed = time(&balancer, &ack, &nothing)?;
    let counted = katran.counter(LRU_CNTRS, false)? - seen;
    katran.set_vip_flags(0)?;
    rows.push(KatranRow {
        label: "Katran: established, ring only (F_LRU_BYPASS), IPIP".into(),
        result: result(
            timed,
            (counted != total).then(|| format!("void: {counted} of {total} runs reached the VIP")),
        ),
    });

    // A SYN: the ring, then an LRU insert (the rate counter emptied before each run, out
    // of the timed part, so that the bench's own SYN rate is no flood).
    let syn_misses = katran.counter(LRU_MISS_CNTR, false)?;
    let timed = time(&balancer, &syn, &|| katran.forget_connection_rate())?;
    let placed = katran.counter(LRU_MISS_CNTR, false)? - syn_misses;
    rows.push(KatranRow {
        label: "Katran: SYN, ring + LRU insert, IPIP".into(),
        result: result(
            timed,
            (placed != total).then(|| format!("void: {placed} of {total} SYNs took the ring")),
        ),
    });
    Ok(rows)
}

pub fn render(rows: &[KatranRow], object: &FilePath, markdown: bool) -> String {
    let mut out = format!(
        "Katran ({}), unwrapped, net of bench_bare_tx; cheetah's first row the same way:\n",
        object.display()
    );
    let mut line = |cells: [String; 4]| {
        if markdown {
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        } else {
            out.push_str(&format!(
                "{:<54} {:>18} {:>16} {:>22}\n",
                cells[0], cells[1], cells[2], cells[3]
            ));
        }
    };
    line([
        "path".into(),
        "program ns median (p10-p90)".into(),
        "bench_bare_tx ns".into(),
        "program - bare ns median (p10-p90)".into(),
    ]);
    if markdown {
        line(["---".into(), "---".into(), "---".into(), "---".into()]);
    }
    for row in rows {
        let cells = match &row.result {
            Ok((subject, bare, net)) => [
                row.label.clone(),
                format!(
                    "{:.0} ({:.0}-{:.0})",
                    subject.median, subject.p10, subject.p90
                ),
                format!("{:.0} ({:.0}-{:.0})", bare.median, bare.p10, bare.p90),
                format!("**{:.0}** ({:.0}-{:.0})", net.median, net.p10, net.p90),
            ],
            Err(void) => [
                row.label.clone(),
                void.clone(),
                String::new(),
                String::new(),
            ],
        };
        line(cells);
    }
    out
}
