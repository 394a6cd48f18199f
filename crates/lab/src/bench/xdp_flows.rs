//! `cheetah bench --xdp-flows`: the in-kernel path's cost against the number of distinct
//! flows the packets cycle over (1 to 10^7), for the cookie paths (no state per flow), for
//! the fallback table of clients without timestamps (bpf/lib/fallback.h: the core's
//! set-associative table, shared by all CPUs), and for a connection-table path
//! (`bench_flows_katran_lru` in bpf/xdp_bench.c: the 5-tuple looked up in an LRU hash
//! shared by all CPUs, as Katran's connection table).
//!
//! The fallback curve sends a client ACK without TCP options for each flow; the table (over
//! the kernel's words, sized to twice the largest N rounded up to a power of two) holds the
//! N flows, inserted through the core at the kernel's current time. Its flows are the
//! first N clients whose set still has a free way, so that no flow evicts another (a set
//! holds 8; at half the capacity about 2% of the sets would overflow): the cursor then
//! cycles over flows that are all in the table. While it is timed, `bench_flows` holds
//! those clients (the other curves' are written back after).
//!
//! Flow i's client is 11.0.0.0 + i, port 1024 + i mod 60000; its cookie (the TSecr it
//! echoes) is what the core's layout encodes for server 1 + i mod servers with the
//! servers' MSB. Each run's wrapper copies the pristine frame, then writes the next flow's
//! client (and cookie) into it from the `bench_flows` array, i cycling over N flows by a
//! per-CPU cursor; the trivial program does the same copy and writes with a cursor of its
//! own, started half a cycle away, so its reads of `bench_flows` miss the cache as the
//! LB's do and the difference is the LB's own. The connection table is filled with every
//! flow up to the largest N before it is timed at that N (so at small N it holds more
//! entries than the packets use, as a production table would). Each point times
//! max(--xdp-runs, N) pairs: every flow at least once. A point counts only if every run
//! took the fast path (its counter moved once per run) with the expected action.

use std::path::PathBuf;

use anyhow::{ensure, Context};
use cheetah_core::lb::fallback::{FallbackTable, WAYS};
use cheetah_core::types::ServerId;
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::xdp_layout::{
    STAT_FAST_CLIENT_COOKIE, STAT_FAST_CLIENT_FALLBACK, STAT_FAST_CLIENT_PICK,
    STAT_FAST_SERVER_COOKIE,
};
use libbpf_rs::{MapCore, MapFlags};

use super::xdp::{
    enter_new_namespace, frame_client, machine_note, map, place, program, read_setting, spread,
    stat, test_run, Bench, Path, Spread, SERVER_MSB, SETUPS, WARM_UP_RUNS, XDP_REDIRECT, XDP_TX,
};
use super::xdp_flows_plot;

/// The points of the curves; the largest is capped by --xdp-flows-max.
const FLOW_COUNTS: [u32; 7] = [1, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];
/// Flow i's client address is this + i: 11.0.0.0/8 holds 2^24 clients.
const FIRST_CLIENT: u32 = 0x0b00_0000;
const MAX_FLOWS: u32 = 1 << 24;
const FIRST_CLIENT_PORT: u32 = 1024;
const CLIENT_PORTS: u32 = 60_000;
/// Flows written per batch syscall when filling the maps.
const BATCH: usize = 1 << 20;
/// `enum flow_cursor` of bpf/xdp_bench.c.
const CURSOR_SUBJECT: u32 = 0;
const CURSOR_TRIVIAL: u32 = 1;

pub struct Options {
    pub runs: u32,
    pub servers: u16,
    pub core: Option<usize>,
    pub realtime: bool,
    pub markdown: bool,
    pub max_flows: u32,
    pub plot: Option<PathBuf>,
}

/// The fallback table's capacity for `flows` flows: twice as many, rounded as the core
/// rounds it (0: the config's).
pub(super) fn fallback_table_size(flows: u32) -> usize {
    if flows == 0 {
        0
    } else {
        FallbackTable::rounded_capacity(2 * flows as usize)
    }
}

/// bench_connections' size for `flows` flows: all of them and room for the per-CPU free
/// lists of the kernel's LRU (LOCAL_FREE_TARGET, 128 per CPU), so filling it evicts none.
pub(super) fn connection_table_size(flows: u32) -> u32 {
    if flows == 0 {
        1
    } else {
        flows + flows / 8 + 4096
    }
}

/// One curve: a program timed against its trivial counterpart on one frame.
struct Curve {
    label: &'static str,
    subject: &'static str,
    trivial: &'static str,
    direction: Path,
    action: u32,
    stat: u32,
}

const CURVES: [Curve; 4] = [
    Curve {
        label: "cheetah established client->server (l2)",
        subject: "bench_flows_client_lb",
        trivial: "bench_flows_client_trivial",
        direction: Path::ClientToServer,
        action: XDP_TX,
        stat: STAT_FAST_CLIENT_COOKIE,
    },
    Curve {
        label: "cheetah server->client (l2)",
        subject: "bench_flows_reply_lb",
        trivial: "bench_flows_reply_trivial",
        direction: Path::ServerToClient,
        action: XDP_REDIRECT,
        stat: STAT_FAST_SERVER_COOKIE,
    },
    Curve {
        label: "fallback table hit client->server (l2)",
        subject: "bench_flows_client_lb",
        trivial: "bench_flows_client_trivial",
        direction: Path::FallbackHit,
        action: XDP_TX,
        stat: STAT_FAST_CLIENT_FALLBACK,
    },
    Curve {
        label: "Katran-style LRU client->server (l2)",
        subject: "bench_flows_katran_lru",
        trivial: "bench_flows_client_trivial",
        direction: Path::ClientToServer,
        action: XDP_TX,
        stat: STAT_FAST_CLIENT_PICK,
    },
];

pub(super) struct Point {
    pub(super) flows: u32,
    pub(super) runs: u32,
    /// Per curve (CURVES' order): net ns, or why the point is void.
    pub(super) nets: Vec<Result<Spread, String>>,
}

pub(super) fn curve_labels() -> Vec<&'static str> {
    CURVES.iter().map(|c| c.label).collect()
}

fn flow_client(i: u32) -> (u32, u16) {
    (
        FIRST_CLIENT + i,
        (FIRST_CLIENT_PORT + i % CLIENT_PORTS) as u16,
    )
}

pub fn run(options: Options) -> anyhow::Result<()> {
    // SAFETY: no arguments, no memory.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "cheetah bench --xdp-flows needs root: it loads XDP programs and makes a network namespace"
    );
    ensure!(
        (1..=MAX_FLOWS).contains(&options.max_flows),
        "--xdp-flows-max must be in 1..={MAX_FLOWS} (the clients are 11.0.0.0/8)"
    );
    ensure!(options.runs >= 1, "--xdp-runs must be at least 1");
    let counts: Vec<u32> = FLOW_COUNTS
        .iter()
        .copied()
        .filter(|&n| n <= options.max_flows)
        .collect();
    let largest = *counts
        .last()
        .context("no flow count up to --xdp-flows-max")?;
    let jit = read_setting("/proc/sys/net/core/bpf_jit_enable");
    let ports = enter_new_namespace(0)?;
    let (pin, rt, placement) = place(options.core, options.realtime);
    let bench = Bench::load(&SETUPS[0], options.servers, largest)?;
    fill_flows(&bench, largest, options.servers)?;
    let fallback_flows = fallback_flows(&bench, largest);
    let mut points = Vec::new();
    let mut in_table = 0;
    for &flows in &counts {
        fill_connections(&bench, in_table, flows, options.servers)?;
        fill_fallback(
            &bench,
            &fallback_flows[in_table as usize..flows as usize],
            options.servers,
        );
        in_table = flows;
        // The table is filled up to this point's N only: at N it holds N flows (and the
        // smaller points' flows are among them).
        map(bench.program.object(), "bench_flow_count")?
            .update(&0u32.to_ne_bytes(), &flows.to_ne_bytes(), MapFlags::ANY)
            .context("cannot write bench_flow_count")?;
        let runs = options.runs.max(flows);
        let nets = CURVES
            .iter()
            .map(|curve| {
                if curve.direction != Path::FallbackHit {
                    return time_curve(&bench, curve, flows, runs, ports.servers.ifindex);
                }
                write_flows(&bench, &fallback_flows[..flows as usize])?;
                let net = time_curve(&bench, curve, flows, runs, ports.servers.ifindex);
                fill_flows(&bench, flows, options.servers)?;
                net
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let point = Point { flows, runs, nets };
        eprintln!("{}", point_line(&point));
        points.push(point);
    }
    if let Some(rt) = rt {
        rt.release();
    }
    if let Some(pin) = pin {
        pin.release();
    }
    println!("{}", machine_note(&placement, &jit));
    println!(
        "runs: max(--xdp-runs = {}, N) pairs per point (alternating subject, trivial), BPF_PROG_TEST_RUN repeat = 1, after {WARM_UP_RUNS} untimed runs of each; connection table: {} entries, fallback table: {} flows, both shared by all CPUs",
        options.runs,
        connection_table_size(largest),
        bench.plane.shared().fallback.capacity()
    );
    print!("{}", render(&points, options.markdown));
    if let Some(path) = &options.plot {
        xdp_flows_plot::draw(&points, path)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// Writes flows 0..count into bench_flows: each client and the cookie its ACKs echo.
fn fill_flows(bench: &Bench, count: u32, servers: u16) -> anyhow::Result<()> {
    let shared = bench.plane.shared();
    let layout = shared.layout();
    let snapshot = shared.snapshot.load();
    let prefix = snapshot.vip_hash_prefix(0);
    let flows: Vec<FlowEntry> = (0..count)
        .map(|i| {
            let (addr, port) = flow_client(i);
            let server = ServerId(1 + (i % u32::from(servers)) as u16);
            let cookie = layout.encode(server, prefix.finish(addr, port), SERVER_MSB);
            (addr, port, cookie)
        })
        .collect();
    write_flows(bench, &flows)
}

/// A `struct bench_flow`: client address, port, and the cookie its ACKs echo.
type FlowEntry = (u32, u16, u16);

/// Writes `flows` into bench_flows from index 0.
fn write_flows(bench: &Bench, flows: &[FlowEntry]) -> anyhow::Result<()> {
    let map = map(bench.program.object(), "bench_flows")?;
    for (batch, chunk) in flows.chunks(BATCH).enumerate() {
        let start = (batch * BATCH) as u32;
        let mut keys = Vec::with_capacity(chunk.len() * 4);
        let mut values = Vec::with_capacity(chunk.len() * 8);
        for (n, (addr, port, cookie)) in chunk.iter().enumerate() {
            keys.extend_from_slice(&(start + n as u32).to_ne_bytes());
            values.extend_from_slice(&addr.to_be_bytes());
            values.extend_from_slice(&port.to_be_bytes());
            values.extend_from_slice(&cookie.to_be_bytes());
        }
        map.update_batch(
            &keys,
            &values,
            chunk.len() as u32,
            MapFlags::ANY,
            MapFlags::ANY,
        )
        .context("cannot fill bench_flows")?;
    }
    Ok(())
}

/// The fallback curve's first `count` flows: the first clients whose set of the fallback
/// table still has a free way once the earlier ones are in (see the module docs). Their
/// cookie field is unused (an ACK without options has no TSecr).
fn fallback_flows(bench: &Bench, count: u32) -> Vec<FlowEntry> {
    let shared = bench.plane.shared();
    let snapshot = shared.snapshot.load();
    let prefix = snapshot.vip_hash_prefix(0);
    let mask = shared.fallback.sets() as u64 - 1;
    let mut used = vec![0u8; shared.fallback.sets()];
    // The bench frame's own connection (`Bench::fallback_frame`) takes a way too.
    let (client, port) = frame_client();
    used[(prefix.finish(client, port) & mask) as usize] += 1;
    let mut flows = Vec::with_capacity(count as usize);
    for i in 0..MAX_FLOWS {
        if flows.len() == count as usize {
            break;
        }
        let (addr, port) = flow_client(i);
        let set = &mut used[(prefix.finish(addr, port) & mask) as usize];
        if usize::from(*set) < WAYS {
            *set += 1;
            flows.push((addr, port, 0));
        }
    }
    flows
}

/// Inserts `flows` into the fallback table through the core, at the kernel's current time
/// (its clock base is `FRAMES_AT` before the publication, xdp.rs).
fn fill_fallback(bench: &Bench, flows: &[FlowEntry], servers: u16) {
    let shared = bench.plane.shared();
    let snapshot = shared.snapshot.load();
    let prefix = snapshot.vip_hash_prefix(0);
    let now = monotonic_ns() - bench.clock_base_ns;
    for (n, (addr, port, _)) in flows.iter().enumerate() {
        let server = ServerId(1 + (n as u32 % u32::from(servers)) as u16);
        shared
            .fallback
            .insert(prefix.finish(*addr, *port), server, now);
    }
}

/// Adds flows from..to to bench_connections: (client, VIP, 6) -> the flow's server.
fn fill_connections(bench: &Bench, from: u32, to: u32, servers: u16) -> anyhow::Result<()> {
    let table = map(bench.program.object(), "bench_connections")?;
    let vip = cheetah_core::testkit::VIP;
    let vip_port = cheetah_core::testkit::VIP_PORT;
    for start in (from..to).step_by(BATCH) {
        let end = to.min(start + BATCH as u32);
        let mut keys = Vec::with_capacity((end - start) as usize * 16);
        let mut values = Vec::with_capacity((end - start) as usize * 4);
        for i in start..end {
            let (addr, port) = flow_client(i);
            // struct bench_five_tuple: saddr, daddr, sport, dport, protocol, 3 pad bytes.
            keys.extend_from_slice(&addr.to_be_bytes());
            keys.extend_from_slice(&vip.to_be_bytes());
            keys.extend_from_slice(&port.to_be_bytes());
            keys.extend_from_slice(&vip_port.to_be_bytes());
            keys.extend_from_slice(&[6, 0, 0, 0]);
            values.extend_from_slice(&(1 + i % u32::from(servers)).to_ne_bytes());
        }
        table
            .update_batch(&keys, &values, end - start, MapFlags::ANY, MapFlags::ANY)
            .context("cannot fill bench_connections")?;
    }
    Ok(())
}

/// Starts the subject's cursor at flow 0 and the trivial one's half a cycle away, on every
/// CPU.
fn reset_cursors(bench: &Bench, flows: u32) -> anyhow::Result<()> {
    let cursors = map(bench.program.object(), "bench_flow_cursor")?;
    let cpus = libbpf_rs::num_possible_cpus()?;
    for (key, start) in [(CURSOR_SUBJECT, 0), (CURSOR_TRIVIAL, flows / 2)] {
        let values = vec![start.to_ne_bytes().to_vec(); cpus];
        cursors
            .update_percpu(&key.to_ne_bytes(), &values, MapFlags::ANY)
            .context("cannot write bench_flow_cursor")?;
    }
    Ok(())
}

fn time_curve(
    bench: &Bench,
    curve: &Curve,
    flows: u32,
    runs: u32,
    ingress: u32,
) -> anyhow::Result<Result<Spread, String>> {
    let (frame, _) = bench.frame(curve.direction)?;
    bench.write_frame(&frame)?;
    reset_cursors(bench, flows)?;
    let object = bench.program.object();
    let subject = program(object, curve.subject)?;
    let trivial = program(object, curve.trivial)?;
    let before = stat(object, curve.stat)?;
    let mut differences = Vec::with_capacity(runs as usize);
    let mut wrong_action = None;
    for n in 0..WARM_UP_RUNS + runs {
        let (action, subject_ns) = test_run(&subject, &frame, ingress)?;
        let (_, trivial_ns) = test_run(&trivial, &frame, ingress)?;
        if action != curve.action {
            wrong_action.get_or_insert(action);
        }
        if n >= WARM_UP_RUNS {
            differences.push(f64::from(subject_ns) - f64::from(trivial_ns));
        }
    }
    let moved = stat(object, curve.stat)? - before;
    let expected = u64::from(WARM_UP_RUNS + runs);
    Ok(if let Some(action) = wrong_action {
        Err(format!("void: {} returned {action}", curve.subject))
    } else if moved != expected {
        Err(format!(
            "void: the fast path's counter moved {moved} times in {expected} runs"
        ))
    } else {
        Ok(spread(differences))
    })
}

fn point_line(point: &Point) -> String {
    let mut line = format!("N = {:>8} ({} runs):", point.flows, point.runs);
    for (curve, net) in CURVES.iter().zip(&point.nets) {
        match net {
            Ok(net) => line.push_str(&format!("  {} {:.0} ns", curve.label, net.median)),
            Err(void) => line.push_str(&format!("  {} {void}", curve.label)),
        }
    }
    line
}

fn render(points: &[Point], markdown: bool) -> String {
    let mut header = vec!["flows N".to_string()];
    header.extend(
        CURVES
            .iter()
            .map(|c| format!("{} ns median (p10 to p90)", c.label)),
    );
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        if markdown {
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        } else {
            out.push_str(&format!("{:<10}", cells[0]));
            for cell in &cells[1..] {
                out.push_str(&format!(" {cell:>44}"));
            }
            out.push('\n');
        }
    };
    line(&header);
    if markdown {
        line(&vec!["---".to_string(); header.len()]);
    }
    for point in points {
        let mut cells = vec![point.flows.to_string()];
        cells.extend(point.nets.iter().map(|net| match net {
            Ok(net) => format!("**{:.0}** ({:.0} to {:.0})", net.median, net.p10, net.p90),
            Err(void) => void.clone(),
        }));
        line(&cells);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_have_distinct_clients_within_the_clients_prefix() {
        let last = flow_client(MAX_FLOWS - 1);
        assert_eq!(last.0 >> 24, FIRST_CLIENT >> 24);
        assert_ne!(flow_client(0), flow_client(CLIENT_PORTS));
    }

    #[test]
    fn the_connection_table_has_room_beyond_its_flows() {
        assert_eq!(connection_table_size(0), 1);
        assert!(connection_table_size(10_000_000) > 10_000_000 + 2 * 128 * 64);
    }
}
