//! Loads the XDP program (`bpf/xdp_lb.c`, made of `bpf/lib/`), fills its maps and attaches it. What it
//! shares with the program (limits, counters, map keys) is in `bpf/include/cheetah_shared.h`.
//!
//! The program is attached with plain netlink (no bpf_link), so it outlives this process:
//! after a crash or `kill -9` it keeps dropping VIP traffic instead of letting the host
//! kernel answer it with RSTs, until the next `cheetah run` replaces it atomically.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, RawFd};
use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Relaxed, Release},
};
use std::sync::OnceLock;

use cheetah_core::cookie::msb::COOKIES;
use cheetah_core::cookie::CookieLayout;
use cheetah_core::cookie::{ClockWords, MsbTable, SharedWords};
use cheetah_core::lb::closes::{CloseFilter, DEFAULT_SLOTS as CLOSE_SLOTS};
use cheetah_core::lb::fallback::{FallbackTable, WAYS};
use cheetah_core::lb::handshakes::HandshakeTable;
use cheetah_core::lb::SharedTables;
use cheetah_core::types::ServerId;

use super::map_memory::MapMemory;
use super::pin::{self, PinDir, PinReport};
use super::publish_window::{PublishSeq, PublishWindow};
use super::xdp_layout::{
    ActiveRow, Encode, HandshakeWords, LbConfigValue, PolicyRngState, PolicyState, PublishedRow,
    ServerInfo, ServerLoadValue, ServerTraffic, FAST_BUNDLES, FAST_EVENTS, LOAD_METRICS,
    LOAD_METRIC_BYTES, LOAD_METRIC_PACKETS, LOAD_METRIC_REPORTED, PUBLISH_COPIES, SERVER_FORWARDS,
    SERVER_ID_SPACE, STAT_ECHO_BEYOND_IDLE_LIMIT, STAT_GENERAL_PATH, STAT_NEXT_HOP_CACHE_MISS,
    STAT_NEXT_HOP_MISS, STAT_OPTIONS_COMPARED, STAT_OPTIONS_WALKED, STAT_REPLY_BY_STEERING,
    UP_REASONS,
};

use anyhow::{bail, Context};
use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder, OpenObject, Xdp, XdpFlags};

static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_lb.o"));

/// The program's function name in bpf/xdp_lb.c, as `bpftool prog` shows it.
const PROGRAM_NAME: &str = "cheetah_lb";

pub const MAX_QUEUES: u32 = 64;
pub const MAX_INTERFACES: usize = 16;
pub const MAX_HOST_ADDRS: usize = 256;

/// Indices of the program's per-CPU `stats` array (`enum xdp_stat`).
pub(super) const STAT_TO_SOCKET: u32 = 0;
pub(super) const STAT_NO_SOCKET: u32 = 1;
pub(super) const STAT_PASSED: u32 = 2;
pub(super) const STAT_NO_METADATA_ROOM: u32 = 3;

/// Which XDP hook to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum XdpMode {
    /// Driver mode where the interface supports it, generic (skb) mode otherwise.
    #[default]
    Auto,
    Native,
    Generic,
}

/// Counters kept by the XDP program itself (per CPU, summed here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SteeringStats {
    pub to_socket: u64,
    /// Owned packets dropped because no socket was bound for their queue.
    pub no_socket: u64,
    pub passed_to_host: u64,
    pub no_metadata_room: u64,
    /// Packets the in-kernel path handled, by `STAT_FAST_*` (`xdp_layout::FAST_BUNDLES`).
    pub fast: [u64; FAST_BUNDLES.len()],
    /// Packets the in-kernel path handed to userspace, by `xdp_layout::UP_REASONS`.
    pub up: [u64; UP_REASONS.len()],
    /// Packets the in-kernel path handled that are no single bundle (closes, ICMP
    /// errors), by `xdp_layout::FAST_EVENTS`.
    pub events: [u64; FAST_EVENTS.len()],
    /// Replies whose next hop the kernel asked `bpf_fib_lookup` for (not in `next_hops`).
    pub next_hop_miss: u64,
    /// Replies whose next hop this CPU's `next_hop_cache` did not hold: read from
    /// `next_hops` (or the FIB) instead.
    pub next_hop_cache_miss: u64,
    /// Server replies `reply_senders` did not know: found by steering's lookups instead.
    pub reply_by_steering: u64,
    /// Packets handled whose timestamp the options' walk found (`STAT_OPTIONS_WALKED`).
    pub options_walked: u64,
    /// Packets handled as without a timestamp whose timestamp the compare found
    /// (`STAT_OPTIONS_COMPARED`).
    pub options_compared: u64,
    /// Server segments handled that the core's general path takes (`STAT_GENERAL_PATH`).
    pub general_path: u64,
    /// Echoes restored and forwarded beyond the idle limit (`STAT_ECHO_BEYOND_IDLE_LIMIT`).
    pub echo_beyond_idle_limit: u64,
}

// By hand: `events` is longer than the arrays std derives `Default` for.
impl Default for SteeringStats {
    fn default() -> Self {
        SteeringStats {
            to_socket: 0,
            no_socket: 0,
            passed_to_host: 0,
            no_metadata_room: 0,
            fast: [0; FAST_BUNDLES.len()],
            up: [0; UP_REASONS.len()],
            events: [0; FAST_EVENTS.len()],
            next_hop_miss: 0,
            next_hop_cache_miss: 0,
            reply_by_steering: 0,
            options_walked: 0,
            options_compared: 0,
            general_path: 0,
            echo_beyond_idle_limit: 0,
        }
    }
}

pub struct SteeringProgram {
    object: Object,
    /// `lb_config.publish_seq`, mapped on first use (`publish_window`).
    publish_seq: OnceLock<PublishSeq>,
    /// `lb_config.clock_base_ns`, mapped on first use: once, not per call (a mapping is
    /// never unmapped, and a process may hold only `vm.max_map_count` of them).
    clock_base: OnceLock<[&'static AtomicU64; PUBLISH_COPIES]>,
    /// The load view's rows, mapped on first use (`load_rows`).
    load_rows: OnceLock<LoadRows>,
    /// Which maps an earlier run pinned and this one reused (`pin.rs`); empty unpinned.
    pins: PinReport,
}

impl SteeringProgram {
    /// Loads the program with a fallback table for `fallback_capacity` flows (the config's
    /// `fallback_table_capacity`, rounded as `FallbackTable::rounded_capacity` says).
    pub fn load(fallback_capacity: usize) -> anyhow::Result<Self> {
        Self::load_with(fallback_capacity, None)
    }

    /// [`load`](Self::load) over the maps pinned in `pins` (`pin.rs`): those an earlier
    /// run left with this program's definitions are reused with what they hold, the rest
    /// are created and pinned there.
    pub fn load_pinned(fallback_capacity: usize, pins: &PinDir) -> anyhow::Result<Self> {
        Self::load_with(fallback_capacity, Some(pins))
    }

    fn load_with(fallback_capacity: usize, pins: Option<&PinDir>) -> anyhow::Result<Self> {
        let mut open = ObjectBuilder::default()
            .open_memory(PROGRAM)
            .context("cannot open the embedded XDP program")?;
        size_at_load(&mut open, fallback_capacity)?;
        // After every sizing: a map sized otherwise than its pinned one is replaced.
        let report = match pins {
            Some(dir) => pin::prepare(&mut open, dir)?,
            None => PinReport::default(),
        };
        let object = open.load().context(
            "the kernel refused the XDP program (needs root, BPF and XDP support, Linux 5.18 \
                 or later)",
        )?;
        Ok(SteeringProgram {
            pins: report,
            ..Self::from_object(object)
        })
    }

    /// Which maps were reused from an earlier run (`load_pinned`).
    pub fn pins(&self) -> &PinReport {
        &self.pins
    }

    /// The core clock's base an earlier run left in a reused `lb_config`
    /// ([`set_clock_base`](Self::set_clock_base)): the clock to continue, so that the
    /// times in the reused handshake and fallback words stay the core's. `None` when the
    /// map is fresh.
    pub fn kept_clock_base(&self) -> anyhow::Result<Option<u64>> {
        if !self.pins.kept(&["lb_config"]) {
            return Ok(None);
        }
        Ok(Some(self.clock_base()?).filter(|&base| base != 0))
    }

    /// Another loaded object that carries the same maps (bpf/lib/maps.h), such as the
    /// bench's wrapper around `lb_process` (bpf/xdp_bench.c): the map methods and the
    /// publisher then fill its maps as they fill the LB's.
    pub fn from_object(object: Object) -> Self {
        SteeringProgram {
            object,
            publish_seq: OnceLock::new(),
            clock_base: OnceLock::new(),
            load_rows: OnceLock::new(),
            pins: PinReport::default(),
        }
    }

    /// Opens a window of the publisher's latch (`publish_window.rs`): every write to a
    /// map the in-kernel path reads (the tables, the next hops) happens inside one.
    pub fn publish_window(&self) -> anyhow::Result<PublishWindow<'_>> {
        Ok(self.publish_seq()?.open())
    }

    /// The latch's word, mapped once.
    fn publish_seq(&self) -> anyhow::Result<&PublishSeq> {
        if let Some(seq) = self.publish_seq.get() {
            return Ok(seq);
        }
        const WORDS: usize = std::mem::size_of::<LbConfigValue>() / 4;
        let words: &'static [[AtomicU32; WORDS]; PUBLISH_COPIES] =
            self.mmap_values("lb_config", PUBLISH_COPIES)?;
        // Entry 0's: the word the program reads (publish.h).
        let word = &words[0][std::mem::offset_of!(LbConfigValue, publish_seq) / 4];
        Ok(self.publish_seq.get_or_init(|| PublishSeq::new(word)))
    }

    /// The loaded object, for what only tests and the bench do with it
    /// (`BPF_PROG_TEST_RUN`, reading a map directly).
    pub fn object(&self) -> &Object {
        &self.object
    }

    fn map(&self, name: &str) -> libbpf_rs::Map<'_> {
        self.try_map(name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The program's map `name`.
    pub fn try_map(&self, name: &str) -> anyhow::Result<libbpf_rs::Map<'_>> {
        self.object
            .maps()
            .find(|m| m.name() == name)
            .with_context(|| format!("map {name} is missing from the XDP program"))
    }

    /// The program's `msb_seen`, `msb_restores`, `msb_clock` and `handshakes` arrays,
    /// mapped into this process for the core's clock and handshake tables
    /// (`MsbTable::with_words`, `HandshakeTable::with_words`): the kernel reads and writes
    /// the words the workers and the control thread do.
    ///
    /// The mappings are never unmapped: the tables they back live in the `LbShared` that
    /// every thread holds until the process exits, so no point is safe to unmap them, and
    /// a mapping keeps its map alive even once the program object is gone. It is done once
    /// per process (320 KiB, 336 KiB and 2 MiB).
    pub fn kernel_words(&self) -> anyhow::Result<KernelWords> {
        Ok(KernelWords {
            seen: self.mmap_value("msb_seen")?,
            restores: self.mmap_value("msb_restores")?,
            clock: self.mmap_value("msb_clock")?,
            handshakes: self.mmap_value("handshakes")?,
            fallback: self.fallback_words()?,
            kept_clocks: self.pins.kept(&["msb_seen", "msb_restores"]),
            // Their times are the core clock's, whose base a fresh lb_config lost.
            kept_handshakes: self.pins.kept(&["handshakes", "lb_config"]),
        })
    }

    /// The program's `closes` array, mapped into this process for the core's close filter
    /// (`CloseFilter::with_words`), so that the kernel and the workers count each close
    /// once between them. Mapped for the rest of the process, as the clock words are.
    pub fn close_words(&self) -> anyhow::Result<CloseWords> {
        Ok(CloseWords {
            words: self.mmap_value("closes")?,
            kept: self.pins.kept(&["closes"]),
        })
    }

    /// The program's `fallback` array (one set of the table per entry), mapped into this
    /// process for the core's fallback table (`FallbackTable::with_words`): the kernel
    /// looks flows up in the words the workers insert into. Mapped for the rest of the
    /// process, like the clock words.
    pub fn fallback_words(&self) -> anyhow::Result<FallbackWords> {
        let map = self.try_map("fallback")?;
        let set_bytes = WAYS * 8;
        if map.value_size() as usize != set_bytes {
            bail!(
                "map fallback holds values of {} bytes; a set of the fallback table is {set_bytes}",
                map.value_size()
            );
        }
        let words = map.max_entries() as usize * WAYS;
        let at = self.mmap_bytes("fallback", words * 8)?;
        // SAFETY: page-aligned, `words` * 8 bytes long (an array's 64-byte values are
        // contiguous), mapped for the rest of the process; AtomicU64 has u64's layout, and
        // the kernel's accesses are atomic.
        Ok(FallbackWords {
            words: unsafe { std::slice::from_raw_parts(at.cast::<AtomicU64>(), words) },
            kept: self.pins.kept(&["fallback", "lb_config"]),
        })
    }

    /// The one value of the mmapable array `name`, as a `T` made of atomics.
    fn mmap_value<T>(&self, name: &str) -> anyhow::Result<&'static T> {
        self.mmap_values(name, 1)
    }

    /// The `entries` values of the mmapable array `name`, as a `T` made of atomics (an
    /// array of `entries` values of 8-byte multiples lies contiguous in its mapping).
    fn mmap_values<T>(&self, name: &str, entries: usize) -> anyhow::Result<&'static T> {
        let map = self.try_map(name)?;
        let size = std::mem::size_of::<T>();
        // One entry holding every word: an array's entries are 8 bytes apart, so one entry
        // per word would not be the contiguous words the table indexes.
        if map.max_entries() as usize != entries
            || map.value_size() as usize * entries != size
            || map.value_size() % 8 != 0
        {
            bail!(
                "map {name} holds {} values of {} bytes; mapping it needs {entries} of {}",
                map.max_entries(),
                map.value_size(),
                size / entries,
            );
        }
        let at = self.mmap_bytes(name, size)?;
        // SAFETY: page-aligned, `size` bytes long, mapped for the rest of the process (see
        // `kernel_words`); every `T` here is made of atomics with their integers' layout
        // (the C struct's, by shared_layout_tests), and the kernel's accesses are atomic.
        Ok(unsafe { &*(at as *const T) })
    }

    /// The first `bytes` bytes of the BPF_F_MMAPABLE array `name`, mapped shared and kept
    /// for the process (see `kernel_words`).
    fn mmap_bytes(&self, name: &str, bytes: usize) -> anyhow::Result<*mut u8> {
        let map = self.try_map(name)?;
        let memory = MapMemory::of(map.as_fd(), bytes)
            .with_context(|| format!("cannot mmap the XDP program's {name} map"))?;
        Ok(memory.keep_for_process())
    }

    /// Tells the program where the core's clock starts (`lb_config.clock_base_ns`): the
    /// CLOCK_MONOTONIC reading at which the core's `now` was 0. The one writer of that
    /// field; the publisher carries it over when it rewrites `lb_config`.
    pub fn set_clock_base(&self, monotonic_base_ns: u64) -> anyhow::Result<()> {
        // Every entry: the program reads the one of the copy it reads (publish.h).
        for word in self.clock_base_words()? {
            word.store(monotonic_base_ns, Relaxed);
        }
        Ok(())
    }

    /// Where the core's clock starts, as [`set_clock_base`](Self::set_clock_base) left it
    /// (0 before any call).
    pub fn clock_base(&self) -> anyhow::Result<u64> {
        Ok(self.clock_base_words()?[0].load(Relaxed))
    }

    /// `clock_base_ns` in each entry of `lb_config`.
    fn clock_base_words(&self) -> anyhow::Result<[&'static AtomicU64; PUBLISH_COPIES]> {
        if let Some(words) = self.clock_base.get() {
            return Ok(*words);
        }
        const WORDS: usize = std::mem::size_of::<LbConfigValue>() / 8;
        let entries: &'static [[AtomicU64; WORDS]; PUBLISH_COPIES] =
            self.mmap_values("lb_config", PUBLISH_COPIES)?;
        let at = std::mem::offset_of!(LbConfigValue, clock_base_ns) / 8;
        Ok(*self
            .clock_base
            .get_or_init(|| std::array::from_fn(|copy| &entries[copy][at])))
    }

    /// The address the `servers` map holds for `id` as it was last published, if it
    /// forwards to one (read before this run publishes, it is the earlier run's). The copy
    /// packets read: a publisher killed between its flip and its second write left the
    /// other copy behind (publish_window.rs).
    pub fn published_server_dip(&self, id: ServerId) -> anyhow::Result<Option<Ipv4Addr>> {
        let copy = self.publish_seq()?.current() & 1;
        let key = copy * SERVER_ID_SPACE as u32 + u32::from(id.0);
        let value = self
            .try_map("servers")?
            .lookup(&key.to_ne_bytes(), MapFlags::ANY)
            .context("cannot read servers")?;
        Ok(value.and_then(|bytes| {
            let at = |offset: usize| -> [u8; 4] { bytes[offset..offset + 4].try_into().unwrap() };
            let flags = u32::from_ne_bytes(at(std::mem::offset_of!(ServerInfo, flags)));
            (flags & SERVER_FORWARDS != 0)
                .then(|| Ipv4Addr::from(at(std::mem::offset_of!(ServerInfo, dip))))
        }))
    }

    /// Sets each CPU's view of server `id`'s loads, one per possible CPU: each CPU's
    /// active-connection base into its row of `active_rows`, and the published loads, which
    /// are the same for every CPU (`published_loads` in kernel_loads.rs makes them so),
    /// into `published_loads`. Word by word through the mappings, never a word the kernel
    /// writes (an entry's `own`); then `load_generation` moves.
    pub fn set_server_load(&self, id: ServerId, per_cpu: &[ServerLoadValue]) -> anyhow::Result<()> {
        let rows = self.load_rows()?;
        let active = rows.active();
        if per_cpu.len() != active.len() {
            bail!(
                "{} load views for server {id:?}, but active_rows has a row for each of {} CPUs",
                per_cpu.len(),
                active.len()
            );
        }
        let Some(&first) = per_cpu.first() else {
            return Ok(());
        };
        if per_cpu.iter().any(|value| {
            (value.reported, value.packet_rate, value.byte_rate)
                != (first.reported, first.packet_rate, first.byte_rate)
        }) {
            bail!("server {id:?}: the published loads differ between CPUs; the kernel keeps one for all");
        }
        let server = usize::from(id.0);
        for (row, value) in active.iter().zip(per_cpu) {
            row.server[server].base.store(value.active_base, Relaxed);
        }
        let published = rows.published();
        for (metric, load) in [
            (LOAD_METRIC_REPORTED, first.reported),
            (LOAD_METRIC_PACKETS, first.packet_rate),
            (LOAD_METRIC_BYTES, first.byte_rate),
        ] {
            published[usize::from(metric)].server[server].store(load, Relaxed);
        }
        // After the loads: a pick that reads the new generation reads them too.
        rows.generation.fetch_add(1, Release);
        Ok(())
    }

    /// Each CPU's own active-connection count of server `id` in its row (`own`: its
    /// opened + moved_in - closed since the rows were created), for tests and checks.
    pub fn own_active(&self, id: ServerId) -> anyhow::Result<Vec<u64>> {
        let server = usize::from(id.0);
        Ok(self
            .load_rows()?
            .active()
            .iter()
            .map(|row| row.server[server].own.load(Relaxed))
            .collect())
    }

    /// `active_rows` and `published_loads`, mapped once per program and unmapped with it:
    /// only this program's methods hand out references into them.
    fn load_rows(&self) -> anyhow::Result<&LoadRows> {
        if let Some(rows) = self.load_rows.get() {
            return Ok(rows);
        }
        let active = self.try_map("active_rows")?;
        let published = self.try_map("published_loads")?;
        let row_bytes = std::mem::size_of::<ActiveRow>();
        let published_bytes = std::mem::size_of::<PublishedRow>();
        if active.value_size() as usize != row_bytes
            || published.value_size() as usize != published_bytes
            || published.max_entries() as usize != LOAD_METRICS
        {
            bail!("maps active_rows and published_loads are not the layout this build maps");
        }
        let cpus = active.max_entries() as usize;
        let active = MapMemory::of(active.as_fd(), cpus * row_bytes)
            .context("cannot mmap the XDP program's active_rows map")?;
        let published = MapMemory::of(published.as_fd(), LOAD_METRICS * published_bytes)
            .context("cannot mmap the XDP program's published_loads map")?;
        let generation = self.mmap_value::<AtomicU64>("load_generation")?;
        Ok(self.load_rows.get_or_init(|| LoadRows {
            active,
            cpus,
            published,
            generation,
        }))
    }

    /// This many CPUs have a share of each per-CPU map (libbpf's possible CPUs).
    pub fn possible_cpus(&self) -> anyhow::Result<usize> {
        libbpf_rs::num_possible_cpus().context("cannot count the possible CPUs")
    }

    /// Each CPU's instance of the policy of the VIP with index `vip` (`policy_state`).
    pub fn policy_state(&self, vip: u16) -> anyhow::Result<Vec<PolicyState>> {
        let per_cpu = self
            .map("policy_state")
            .lookup_percpu(&(vip as u32).to_ne_bytes(), MapFlags::ANY)
            .context("cannot read policy_state")?
            .unwrap_or_default();
        Ok(per_cpu.iter().map(|v| PolicyState::read(v)).collect())
    }

    /// Sets each CPU's instance of the policy of the VIP with index `vip`, one per
    /// possible CPU.
    pub fn set_policy_state(&self, vip: u16, per_cpu: &[PolicyState]) -> anyhow::Result<()> {
        let values: Vec<Vec<u8>> = per_cpu.iter().map(Encode::to_bytes).collect();
        self.map("policy_state")
            .update_percpu(&(vip as u32).to_ne_bytes(), &values, MapFlags::ANY)
            .context("cannot update policy_state")
    }

    /// Each CPU's random generator (`policy_rng`).
    pub fn policy_rng(&self) -> anyhow::Result<Vec<PolicyRngState>> {
        let per_cpu = self
            .map("policy_rng")
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .context("cannot read policy_rng")?
            .unwrap_or_default();
        Ok(per_cpu
            .iter()
            .map(|v| PolicyRngState {
                s: std::array::from_fn(|i| {
                    u64::from_ne_bytes(v[8 * i..8 * i + 8].try_into().unwrap())
                }),
            })
            .collect())
    }

    /// Seeds each CPU's random generator, one state per possible CPU.
    pub fn set_policy_rng(&self, per_cpu: &[PolicyRngState]) -> anyhow::Result<()> {
        let values: Vec<Vec<u8>> = per_cpu.iter().map(Encode::to_bytes).collect();
        self.map("policy_rng")
            .update_percpu(&0u32.to_ne_bytes(), &values, MapFlags::ANY)
            .context("cannot update policy_rng")
    }

    fn program(&self) -> libbpf_rs::Program<'_> {
        self.object
            .progs()
            .find(|p| p.name() == PROGRAM_NAME)
            .unwrap_or_else(|| panic!("program {PROGRAM_NAME} is missing from bpf/xdp_lb.c"))
    }

    pub fn set_interface_slot(&self, ifindex: u32, slot: u32) -> anyhow::Result<()> {
        self.map("interface_slots")
            .update(&ifindex.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
            .context("cannot update interface_slots")
    }

    /// Makes `interface_slots` hold exactly `slots` (ifindex, slot): a pinned map may hold
    /// an earlier run's interfaces.
    pub fn set_interface_slots(&self, slots: &[(u32, u32)]) -> anyhow::Result<()> {
        for &(ifindex, slot) in slots {
            self.set_interface_slot(ifindex, slot)?;
        }
        let map = self.map("interface_slots");
        let stale: Vec<Vec<u8>> = map
            .keys()
            .filter(|k| !slots.iter().any(|(i, _)| i.to_ne_bytes()[..] == k[..]))
            .collect();
        for key in stale {
            map.delete(&key)
                .context("cannot delete from interface_slots")?;
        }
        Ok(())
    }

    /// Replaces the set of the host's own addresses: a NAT backend's packet addressed to
    /// one of them answers the host (a health probe), and goes to the kernel.
    pub fn set_host_addrs(&self, addrs: &[Ipv4Addr]) -> anyhow::Result<()> {
        if addrs.len() > MAX_HOST_ADDRS {
            bail!(
                "the host has {} IPv4 addresses; the XDP program holds {MAX_HOST_ADDRS}",
                addrs.len()
            );
        }
        let map = self.map("host_addrs");
        for addr in addrs {
            map.update(&addr.octets(), &0u32.to_ne_bytes(), MapFlags::ANY)
                .context("cannot update host_addrs")?;
        }
        let stale: Vec<Vec<u8>> = map
            .keys()
            .filter(|k| !addrs.iter().any(|a| a.octets()[..] == k[..]))
            .collect();
        for key in stale {
            map.delete(&key).context("cannot delete from host_addrs")?;
        }
        Ok(())
    }

    /// Runs `frame` through the (loaded, not necessarily attached) program with
    /// BPF_PROG_TEST_RUN, as if it arrived on `ingress_ifindex` (an interface of this
    /// namespace; `lo` is 1): the verdict (`enum xdp_action`) and the bytes it left. For
    /// tests that hold the program to the core.
    // `ProgramInput` is non-exhaustive: no struct literal outside libbpf-rs.
    #[allow(clippy::field_reassign_with_default)]
    pub fn test_run(&self, frame: &[u8], ingress_ifindex: u32) -> anyhow::Result<(u32, Vec<u8>)> {
        let prog = self
            .object
            .progs_mut()
            .find(|p| p.name() == PROGRAM_NAME)
            .with_context(|| format!("program {PROGRAM_NAME} is missing"))?;
        // `struct xdp_md`: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex; the kernel wants data_end = the frame's length (no metadata in
        // front) and takes the ingress interface and queue from it.
        let mut context = [0u8; 24];
        context[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        context[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
        let mut out = vec![0u8; frame.len() + 256];
        let input = libbpf_rs::ProgramInput {
            context_in: Some(&mut context),
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let output = prog.test_run(input).context("BPF_PROG_TEST_RUN")?;
        let data = output
            .data
            .context("BPF_PROG_TEST_RUN gave no data")?
            .to_vec();
        Ok((output.return_value, data))
    }

    pub fn bind_socket(&self, slot: u32, queue: u32, fd: RawFd) -> anyhow::Result<()> {
        let key = slot * MAX_QUEUES + queue;
        self.map("xsks")
            .update(
                &key.to_ne_bytes(),
                &(fd as u32).to_ne_bytes(),
                MapFlags::ANY,
            )
            .with_context(|| format!("cannot put the socket for slot {slot} queue {queue} in xsks"))
    }

    /// Attaches (or atomically replaces whatever XDP program is there) and returns the mode
    /// used.
    pub fn attach(
        &self,
        ifname: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> anyhow::Result<&'static str> {
        let prog = self.program();
        let xdp = Xdp::new(prog.as_fd());
        let try_mode = |flags: XdpFlags| -> anyhow::Result<()> {
            // A program attached in the other mode blocks this one: native and generic XDP
            // cannot be active together. It is ours from an earlier run; take it off.
            if xdp
                .attach(ifindex as i32, XdpFlags::from_bits_retain(flags.bits()))
                .is_err()
            {
                let _ = xdp.detach(ifindex as i32, XdpFlags::SKB_MODE);
                let _ = xdp.detach(ifindex as i32, XdpFlags::DRV_MODE);
                xdp.attach(ifindex as i32, flags)?;
            }
            Ok(())
        };
        match mode {
            XdpMode::Native => try_mode(XdpFlags::DRV_MODE)
                .with_context(|| format!("interface {ifname}: native XDP attach failed"))
                .map(|_| "native"),
            XdpMode::Generic => try_mode(XdpFlags::SKB_MODE)
                .with_context(|| format!("interface {ifname}: generic XDP attach failed"))
                .map(|_| "generic"),
            XdpMode::Auto => match try_mode(XdpFlags::DRV_MODE) {
                Ok(()) => Ok("native"),
                Err(native) => {
                    tracing::warn!(interface = ifname, error = %native, "native XDP unavailable, using generic mode");
                    try_mode(XdpFlags::SKB_MODE)
                        .with_context(|| format!("interface {ifname}: XDP attach failed"))
                        .map(|_| "generic")
                }
            },
        }
    }

    pub fn stats(&self) -> SteeringStats {
        let map = self.map("stats");
        let sum = |index: u32| -> u64 {
            map.lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|values| {
                    values
                        .iter()
                        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
                        .sum()
                })
                .unwrap_or(0)
        };
        SteeringStats {
            to_socket: sum(STAT_TO_SOCKET),
            no_socket: sum(STAT_NO_SOCKET),
            passed_to_host: sum(STAT_PASSED),
            no_metadata_room: sum(STAT_NO_METADATA_ROOM),
            fast: FAST_BUNDLES.map(|(index, _)| sum(index)),
            up: UP_REASONS.map(|(index, _)| sum(index)),
            events: FAST_EVENTS.map(|(index, _)| sum(index)),
            next_hop_miss: sum(STAT_NEXT_HOP_MISS),
            next_hop_cache_miss: sum(STAT_NEXT_HOP_CACHE_MISS),
            reply_by_steering: sum(STAT_REPLY_BY_STEERING),
            options_walked: sum(STAT_OPTIONS_WALKED),
            options_compared: sum(STAT_OPTIONS_COMPARED),
            general_path: sum(STAT_GENERAL_PATH),
            echo_beyond_idle_limit: sum(STAT_ECHO_BEYOND_IDLE_LIMIT),
        }
    }

    /// What the in-kernel path sent to or received from each of `ids`, summed over CPUs
    /// since the program was loaded.
    pub fn server_traffic(&self, ids: &[ServerId]) -> anyhow::Result<Vec<ServerTraffic>> {
        ids.iter()
            .map(|&id| {
                Ok(self
                    .server_traffic_per_cpu(id)?
                    .into_iter()
                    .fold(ServerTraffic::default(), ServerTraffic::wrapping_add))
            })
            .collect()
    }

    /// Each CPU's share of what the in-kernel path sent to or received from `id`.
    pub fn server_traffic_per_cpu(&self, id: ServerId) -> anyhow::Result<Vec<ServerTraffic>> {
        let per_cpu = self
            .try_map("server_traffic")?
            .lookup_percpu(&(id.0 as u32).to_ne_bytes(), MapFlags::ANY)
            .context("cannot read the XDP program's server_traffic")?
            .unwrap_or_default();
        Ok(per_cpu.iter().map(|cpu| ServerTraffic::read(cpu)).collect())
    }
}

/// The XDP program's clock and handshake words, mapped for the rest of the process.
#[derive(Clone, Copy)]
pub struct KernelWords {
    seen: &'static [AtomicU32; ServerId::SPACE],
    restores: &'static [AtomicU32; COOKIES],
    clock: &'static ClockWords,
    handshakes: &'static HandshakeWords,
    fallback: FallbackWords,
    /// The words are an earlier run's, reused from pinned maps: the tables keep them.
    kept_clocks: bool,
    kept_handshakes: bool,
}

impl KernelWords {
    /// A plane's clock, handshake and fallback tables over these words (a `TablesMaker`'s
    /// answer, for `ControlPlane::new_with_tables`), which they clear, unless an earlier
    /// run's pinned maps were reused: then they keep what the words hold (the clock table
    /// learns those clocks from [`kept_clocks`](Self::kept_clocks)). The fallback map was
    /// sized when the program was loaded, for the same config's capacity.
    pub fn tables(self, layout: CookieLayout) -> SharedTables {
        let (seen, restores, clock) = (
            SharedWords::borrowed(self.seen),
            SharedWords::borrowed(self.restores),
            ClockWords::borrowed(self.clock),
        );
        let (slots, retries) = (&self.handshakes.slot, &self.handshakes.retry);
        SharedTables {
            msb: if self.kept_clocks {
                MsbTable::with_kept_words(layout, seen, restores, clock)
            } else {
                MsbTable::with_words(layout, seen, restores, clock)
            },
            handshakes: if self.kept_handshakes {
                HandshakeTable::with_kept_words(slots, retries)
            } else {
                HandshakeTable::with_words(slots, retries)
            },
            fallback: self.fallback.table(),
        }
    }

    /// The clocks an earlier run left in reused pinned words, as
    /// `MsbTable::kept_clocks` gives them (empty when the words are fresh): read before a
    /// state file's import overwrites them, for `MsbTable::import_newer` after it.
    pub fn kept_clocks(self) -> Vec<(ServerId, u32)> {
        if !self.kept_clocks {
            return Vec::new();
        }
        MsbTable::clocks_in(self.seen)
    }

    /// Whether the fallback table's words are an earlier run's (then newer than any saved
    /// file of its flows).
    pub fn kept_fallback(self) -> bool {
        self.fallback.kept
    }

    /// Flows the shared fallback table holds.
    pub fn fallback_capacity(self) -> usize {
        self.fallback.capacity()
    }
}

/// The XDP program's close filter words, mapped for the rest of the process.
#[derive(Clone, Copy)]
pub struct CloseWords {
    words: &'static [AtomicU32; CLOSE_SLOTS],
    /// An earlier run's, reused from a pinned map: the filter keeps its closes.
    kept: bool,
}

impl CloseWords {
    /// A close filter over these words (for `ControlPlane::share_closes`); it clears them
    /// unless they are an earlier run's (pinned).
    pub fn filter(self) -> CloseFilter {
        if self.kept {
            CloseFilter::with_kept_words(self.words)
        } else {
            CloseFilter::with_words(self.words)
        }
    }

    /// The words, as the kernel sees them (tests compare the two sides' filters).
    pub fn words(self) -> &'static [AtomicU32; CLOSE_SLOTS] {
        self.words
    }
}

/// The XDP program's fallback table words, mapped for the rest of the process.
#[derive(Clone, Copy)]
pub struct FallbackWords {
    words: &'static [AtomicU64],
    /// An earlier run's, reused from a pinned map: the table keeps its flows.
    kept: bool,
}

impl FallbackWords {
    /// A fallback table over these words, for a plane's `SharedTables`: cleared, unless
    /// they are an earlier run's (pinned).
    pub fn table(self) -> FallbackTable {
        if self.kept {
            FallbackTable::with_kept_words(self.words)
        } else {
            FallbackTable::with_words(self.words)
        }
    }

    /// Flows the table holds: what the map was sized to at load time.
    pub fn capacity(self) -> usize {
        self.words.len()
    }
}

/// Sizes the maps of an opened (not yet loaded) object that carries the LB's maps whose
/// size is the config's or the machine's: `fallback` ([`size_fallback`]) and
/// `active_rows` (a row per possible CPU).
pub fn size_at_load(open: &mut OpenObject, fallback_capacity: usize) -> anyhow::Result<()> {
    size_fallback(open, fallback_capacity)?;
    let cpus = libbpf_rs::num_possible_cpus().context("cannot count the possible CPUs")?;
    let cpus = u32::try_from(cpus).context("too many possible CPUs for a BPF map")?;
    let mut map = open
        .maps_mut()
        .find(|m| m.name() == "active_rows")
        .context("map active_rows is missing from the XDP program")?;
    map.set_max_entries(cpus)
        .context("cannot size the XDP program's active_rows map")
}

/// `active_rows` (one [`ActiveRow`] per possible CPU) and `published_loads` (one
/// [`PublishedRow`] per metric), mapped shared until the program drops.
struct LoadRows {
    active: MapMemory,
    cpus: usize,
    published: MapMemory,
    /// `load_generation`: moved after every change of the rows, for least loaded's
    /// per-CPU caches in the kernel (bpf/lib/least_loaded.h) to fill again.
    generation: &'static AtomicU64,
}

impl LoadRows {
    fn active(&self) -> &[ActiveRow] {
        // SAFETY: page-aligned, `cpus` rows long (an array's values are contiguous, each
        // row's size a multiple of 8), mapped until `self` drops; made of atomics with
        // their integers' layout (the C struct's, by shared_layout_tests).
        unsafe { std::slice::from_raw_parts(self.active.as_ptr().cast::<ActiveRow>(), self.cpus) }
    }

    fn published(&self) -> &[PublishedRow; LOAD_METRICS] {
        // SAFETY: as `active`, LOAD_METRICS rows long.
        unsafe {
            &*self
                .published
                .as_ptr()
                .cast::<[PublishedRow; LOAD_METRICS]>()
        }
    }
}

/// Sizes the `fallback` map of an opened (not yet loaded) object that carries the LB's
/// maps to hold `fallback_capacity` flows, rounded as the core's table rounds it.
pub fn size_fallback(open: &mut OpenObject, fallback_capacity: usize) -> anyhow::Result<()> {
    let sets = FallbackTable::rounded_capacity(fallback_capacity) / WAYS;
    let sets = u32::try_from(sets).context("fallback_table_capacity: too big for a BPF map")?;
    let mut map = open
        .maps_mut()
        .find(|m| m.name() == "fallback")
        .context("map fallback is missing from the XDP program")?;
    map.set_max_entries(sets)
        .context("cannot size the XDP program's fallback map")
}

/// Takes any XDP program off `ifindex` (both modes).
pub fn detach(ifname: &str, ifindex: u32) -> anyhow::Result<()> {
    // The smallest table: only the program's fd is needed.
    let program = SteeringProgram::load(WAYS)?;
    let prog = program.program();
    let xdp = Xdp::new(prog.as_fd());
    let native = xdp.detach(ifindex as i32, XdpFlags::DRV_MODE);
    let generic = xdp.detach(ifindex as i32, XdpFlags::SKB_MODE);
    match (native, generic) {
        (Err(e), Err(_)) => bail!("interface {ifname}: cannot detach XDP: {e}"),
        _ => Ok(()),
    }
}
