//! `cheetah testbed throughput`: requests/s and latency through the LB in the testbed,
//! beside the same load sent straight to one server and through the LB in hash mode, on
//! the XDP data path and on the AF_XDP one, and what the LB spends per packet: its XDP
//! program's own time (`kernel.bpf_stats_enabled`) and its process's CPU. A benchmark, not
//! a test: numbers go to docs/benchmarks.md with the command that produced them.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bench::xdp_live_probe::{BpfStats, ProgramRuns};
use crate::scrape;
use anyhow::{bail, Context};
use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::policy::PolicyKind;

use super::lb::Lb;
use super::lbconfig;
use crate::loadgen::parse_duration;
use crate::testbed::{self, Options, ServerClocks, Topology};

#[derive(clap::Args, Debug)]
pub struct ThroughputArgs {
    /// Servers in the LB's pool for the "all servers" rows.
    #[arg(long, default_value_t = 4)]
    servers: u16,
    /// Length of each measured wrk run (after a 3 s warm-up).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    duration: Duration,
    /// wrk connections (keep-alive) and threads.
    #[arg(long, default_value_t = 64)]
    connections: u32,
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// What every request fetches.
    #[arg(long, default_value = "/small")]
    path: String,
    #[arg(long, default_value = "thr")]
    prefix: String,
    /// Also write the table (markdown) here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One measured configuration.
#[derive(Debug, Default)]
struct Row {
    name: String,
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU time of the `cheetah run` process per packet the LB forwarded, in ns (None: no
    /// LB). With the XDP data path the packets are forwarded in the kernel's softirqs, not
    /// by the process.
    lb_cpu_ns_per_packet: Option<f64>,
    /// The LB's XDP program's own time per run (`bpf_stats`), in ns: every frame the LB's
    /// interfaces received, forwarded in the kernel or (AF_XDP) steered to the workers.
    xdp_ns_per_run: Option<f64>,
    /// The LB's packets per request (both directions).
    packets_per_request: Option<f64>,
    /// Frames the LB dropped during the run: its drop reasons plus frames lost to a full TX
    /// ring (a healthy run has none; each is a retransmission for some client).
    lb_drops: Option<f64>,
    /// CPU time of the whole machine (all processes, softirqs) per request, in µs.
    host_cpu_us_per_request: f64,
}

/// Removes the testbed when the benchmark ends, also on error.
struct TestbedGuard(String);

impl Drop for TestbedGuard {
    fn drop(&mut self) {
        if let Err(e) = testbed::teardown(&self.0, false) {
            eprintln!("throughput: cannot remove testbed {}: {e:#}", self.0);
        }
    }
}

pub fn run(args: ThroughputArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the throughput benchmark needs root: it builds a testbed and runs the LB (XDP)");
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is not installed (scripts/setup.sh installs it)");
    }
    let options = Options {
        prefix: args.prefix.clone(),
        lbs: 1,
        servers: args.servers,
        clients: 1,
        forwarding: Forwarding::L2,
        mode: Mode::Cheetah,
        policy: PolicyKind::RoundRobin,
        dir: None,
        // The benchmark's rows in docs/benchmarks.md were measured without the servers' tc
        // programs; the clock offsets change nothing the benchmark measures.
        server_clocks: ServerClocks::Shared,
        clients_without_timestamps: 0,
    };
    let topo = Topology::up(&options)?;
    let _guard = TestbedGuard(args.prefix.clone());
    let ns = |role: &str| format!("{}-{role}", args.prefix);
    // The direct row: the router sends server addresses to the LB host, whose kernel
    // forwards them. The testbed's LB host is no router, so forwarding is on for this row
    // only, before any LB runs, and off again before the LB rows.
    sh(&[
        "ip",
        "-n",
        &ns("rt"),
        "route",
        "add",
        "10.20.0.0/24",
        "via",
        "10.10.1.2",
    ])?;
    let lb_forwarding = |on: &str| {
        let settings = [
            ("net.ipv4.conf.lb-c.forwarding", on),
            ("net.ipv4.conf.lb-s.forwarding", on),
        ];
        testbed::sysctl(&ns("lb"), &settings)
    };
    let exe = std::env::current_exe().context("cannot find the cheetah binary")?;
    let dir = topo.files.dir.clone();
    let all: Vec<u16> = (1..=args.servers).collect();
    let client = ns("c1");
    let vip_url = format!("http://{}:{}{}", topo.vip, topo.vip_port, args.path);

    // Only while it lives: the kernel times every BPF program run meanwhile.
    let _bpf_stats = BpfStats::enable()?;
    let mut rows = Vec::new();
    let direct_url = format!("http://{}{}", topo.servers[0].dip, args.path);
    lb_forwarding("1")?;
    let direct = measure(
        &args,
        &client,
        &direct_url,
        "direct to s1 (no LB process)",
        None,
    );
    lb_forwarding("0")?;
    rows.push(direct?);
    for (mode, pool, datapath, name) in [
        (
            Mode::Cheetah,
            &all[..1],
            "xdp",
            "cheetah, pool of 1 (s1), XDP",
        ),
        (Mode::Hash, &all[..1], "xdp", "hash, pool of 1 (s1), XDP"),
        (
            Mode::Cheetah,
            &all[..],
            "xdp",
            "cheetah, all servers (rr), XDP",
        ),
        (Mode::Hash, &all[..], "xdp", "hash, all servers, XDP"),
        (
            Mode::Cheetah,
            &all[..1],
            "afxdp",
            "cheetah, pool of 1 (s1), AF_XDP",
        ),
        (
            Mode::Cheetah,
            &all[..],
            "afxdp",
            "cheetah, all servers (rr), AF_XDP",
        ),
    ] {
        let config = config_for(&topo.files.config, &dir, pool, mode, datapath)?;
        let mut lb = Lb::new(&ns("lb"), &exe, &config, "127.0.0.1:9180", &dir);
        lb.start()?;
        let row = measure(&args, &client, &vip_url, name, Some(&lb));
        lb.stop();
        rows.push(row?);
    }
    let table = table(&args, &rows);
    println!("{table}");
    if let Some(out) = &args.out {
        std::fs::write(out, &table).with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}

fn config_for(
    testbed_config: &Path,
    dir: &Path,
    pool: &[u16],
    mode: Mode,
    datapath: &str,
) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(testbed_config)?;
    let config = lbconfig::config_text(&text, pool, "127.0.0.1:9180")?;
    let mut table: toml::Table = config.parse()?;
    table.insert("mode".into(), mode.name().into());
    table
        .get_mut("daemon")
        .and_then(toml::Value::as_table_mut)
        .context("the testbed's config has no [daemon]")?
        .insert("datapath".into(), datapath.into());
    let path = dir.join(format!(
        "throughput-{}-{}-{datapath}.toml",
        mode.name(),
        pool.len()
    ));
    std::fs::write(&path, toml::to_string(&table)?)?;
    Ok(path)
}

fn measure(
    args: &ThroughputArgs,
    client: &str,
    url: &str,
    name: &str,
    lb: Option<&Lb>,
) -> anyhow::Result<Row> {
    eprintln!("throughput: {name}: {url}");
    wrk(client, url, args, Duration::from_secs(3))?;
    let lb_before = lb.map(lb_sample).transpose()?;
    let host_before = host_busy_ticks()?;
    let result = wrk(client, url, args, args.duration)?;
    let host_after = host_busy_ticks()?;
    let lb_after = lb.map(lb_sample).transpose()?;
    let requests = result.requests_per_sec * args.duration.as_secs_f64();
    let ticks_per_sec = clock_ticks_per_sec();
    let mut row = Row {
        name: name.to_string(),
        requests_per_sec: result.requests_per_sec,
        p50_ms: result.p50_ms,
        p99_ms: result.p99_ms,
        host_cpu_us_per_request: (host_after - host_before) as f64 / ticks_per_sec * 1e6
            / requests.max(1.0),
        ..Row::default()
    };
    if let (Some(before), Some(after)) = (lb_before, lb_after) {
        let packets = (after.packets - before.packets).max(1.0);
        let cpu_s = (after.cpu_ticks - before.cpu_ticks) as f64 / ticks_per_sec;
        row.lb_cpu_ns_per_packet = Some(cpu_s * 1e9 / packets);
        row.packets_per_request = Some(packets / requests.max(1.0));
        row.lb_drops = Some(after.drops - before.drops);
        row.xdp_ns_per_run = after.program.ns_per_run_since(&before.program);
    }
    Ok(row)
}

struct WrkResult {
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn wrk(
    client: &str,
    url: &str,
    args: &ThroughputArgs,
    duration: Duration,
) -> anyhow::Result<WrkResult> {
    let out = Command::new("ip")
        .args(["netns", "exec", client, "wrk", "--latency"])
        .arg(format!("-t{}", args.threads))
        .arg(format!("-c{}", args.connections))
        .arg(format!("-d{}s", duration.as_secs().max(1)))
        .arg(url)
        .output()
        .context("cannot run wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {}{text}", String::from_utf8_lossy(&out.stderr));
    }
    parse_wrk(&text).with_context(|| format!("cannot read wrk's output:\n{text}"))
}

fn parse_wrk(text: &str) -> Option<WrkResult> {
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
    };
    if text.contains("Non-2xx or 3xx responses") || text.contains("Socket errors") {
        return None;
    }
    Some(WrkResult {
        requests_per_sec: field("Requests/sec:")?.parse().ok()?,
        p50_ms: millis(field("50%")?)?,
        p99_ms: millis(field("99%")?)?,
    })
}

/// wrk prints latencies as `812.00us`, `4.91ms` or `1.20s`.
fn millis(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e3)
    } else {
        return None;
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

struct LbSample {
    cpu_ticks: u64,
    packets: f64,
    drops: f64,
    program: ProgramRuns,
}

fn lb_sample(lb: &Lb) -> anyhow::Result<LbSample> {
    let pid = lb.pid().context("the LB is not running")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces): state is field 3, utime 14,
    // stime 15.
    let rest = &stat[stat.rfind(')').context("odd /proc stat")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let cpu_ticks = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    let metrics = lb.metrics()?;
    // What the LB forwarded, in the kernel (worker "xdp") or in its workers.
    let forwarded = scrape::samples(&metrics)
        .filter(|s| {
            s.name == "cheetah_events_total"
                && matches!(s.label("event"), Some("to_server" | "to_client"))
        })
        .map(|s| s.value)
        .sum();
    let program = lb_program(lb.namespace())?;
    Ok(LbSample {
        cpu_ticks,
        packets: forwarded,
        drops: scrape::total(&metrics, "cheetah_drops_total")
            + scrape::total(&metrics, "cheetah_io_tx_ring_full_total"),
        program: ProgramRuns::read(program.as_fd())?,
    })
}

/// The XDP program attached to the LB's interfaces (the same one on both), by the id
/// `ip link` shows.
fn lb_program(ns: &str) -> anyhow::Result<OwnedFd> {
    let out = Command::new("ip")
        .args(["-j", "-n", ns, "link", "show", "dev", "lb-c"])
        .output()
        .context("cannot run ip link")?;
    let links: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("cannot read `ip -j -n {ns} link show dev lb-c`"))?;
    let id = links[0]["xdp"]["prog"]["id"]
        .as_u64()
        .with_context(|| format!("no XDP program on lb-c in {ns}"))?;
    libbpf_rs::Program::fd_from_id(id as u32)
        .with_context(|| format!("cannot open XDP program {id}"))
}

/// Busy time of the whole machine, in clock ticks (all CPUs, user + system + softirq...).
fn host_busy_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().context("empty /proc/stat")?;
    let values: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: all but idle and iowait.
    Ok(values
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum())
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

fn sh(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn table(args: &ThroughputArgs, rows: &[Row]) -> String {
    let mut text = format!(
        "wrk -t{} -c{} -d{}s --latency, GET {} (keep-alive), from {}-c1 behind the router\n\n\
         | configuration | requests/s | p50 ms | p99 ms | XDP program ns/run | LB process CPU ns/packet | LB packets/request | LB frames dropped | host CPU µs/request |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        args.threads,
        args.connections,
        args.duration.as_secs(),
        args.path,
        args.prefix
    );
    for row in rows {
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
        text.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {} | {:.1} |\n",
            row.name,
            row.requests_per_sec,
            row.p50_ms,
            row.p99_ms,
            opt(row.xdp_ns_per_run, 0),
            opt(row.lb_cpu_ns_per_packet, 0),
            opt(row.packets_per_request, 1),
            opt(row.lb_drops, 0),
            row.host_cpu_us_per_request
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK: &str = "Running 15s test @ http://10.99.0.1/small
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.23ms    2.11ms  40.00ms   85.00%
    Req/Sec     6.20k   500.00     7.00k    70.00%
  Latency Distribution
     50%  812.00us
     75%    6.20ms
     90%    7.80ms
     99%    1.21s
  123456 requests in 15.00s, 150.00MB read
Requests/sec:   8230.40
Transfer/sec:     10.00MB
";

    #[test]
    fn wrk_output_is_read_with_its_units() {
        let result = parse_wrk(WRK).unwrap();
        assert_eq!(result.requests_per_sec, 8230.40);
        assert!((result.p50_ms - 0.812).abs() < 1e-9);
        assert!((result.p99_ms - 1210.0).abs() < 1e-9);
    }

    #[test]
    fn a_run_with_errors_is_not_a_result() {
        let failed = format!("{WRK}  Socket errors: connect 0, read 3, write 0, timeout 0\n");
        assert!(parse_wrk(&failed).is_none());
    }
}
