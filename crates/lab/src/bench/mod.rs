//! `cheetah bench`: the per-packet cost of the pipeline on a generated trace.
//!
//! A generated in-memory trace of HTTP-like connections (the `trace` module) is played once through a
//! warm-up LB of each mode (cheetah, plain hash, Maglev), which yields realistic packets:
//! established client packets echo the cookies that LB wrote. Each path's packets are then
//! timed on a pinned core, each in its own buffer restored from a pristine copy every pass
//! (the restore is timed alone and subtracted), in at least five runs whose median, min and
//! max are reported in TSC ticks and ns. `--callgrind` adds instructions per packet counted
//! by callgrind. The targets are printed as PASS/MISS lines; nothing asserts.
//! `--xdp` times the in-kernel path instead (the `xdp` module, with the per-stage breakdown
//! of `xdp_stages`); `--xdp-flows` times it against the number of flows (`xdp_flows`);
//! `--xdp-live` counts the packets per second it forwards on a veth with one CPU, against
//! an XDP_TX reflector (`xdp_live`).
//!
//! `docs/benchmarks.md` has the commands and the results on the reference machine.

mod affinity;
mod callgrind;
mod element;
mod hashcost;
mod items;
mod lab;
mod layouts;
mod packets;
mod pipeline;
mod publisher;
mod report;
mod rng;
mod rows;
mod summary;
mod timing;
mod trace;
mod xdp;
mod xdp_flows;
mod xdp_flows_plot;
mod xdp_katran;
mod xdp_live;
mod xdp_live_net;
mod xdp_live_packet;
pub(crate) mod xdp_live_probe;
mod xdp_stages;

use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use cheetah_core::config::Mode;
use cheetah_core::policy::PolicyKind;

use items::{Item, Path};
use rows::{Subject, Traces};
use summary::{machine_summary, trace_summary};
use timing::{Clock, Measurement, Timed};
use trace::TraceConfig;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Connections in the trace.
    #[arg(long, default_value_t = 16_384)]
    flows: usize,
    /// Most connections open at once.
    #[arg(long, default_value_t = 1_024)]
    concurrency: usize,
    /// Servers behind the VIP.
    #[arg(long, default_value_t = 64)]
    servers: u16,
    /// Seed of the trace generator.
    #[arg(long, default_value_t = TraceConfig::default().seed)]
    seed: u64,
    /// Share of connections whose client offers no TCP timestamps (reported separately).
    #[arg(long, default_value_t = 0.02)]
    no_ts_share: f64,
    /// VIP policy of the LB the trace is played through (SYN rows run every policy).
    #[arg(long, default_value = "rr", value_parser = PolicyKind::from_str)]
    trace_policy: PolicyKind,
    /// Undisturbed runs per row (at least 5) whose median, min and max are reported. Runs
    /// during which another process took the core are made again, up to 4x this many.
    #[arg(long, default_value_t = 31)]
    runs: usize,
    /// Packets per run (whole passes over the path's packets, rounded up).
    #[arg(long, default_value_t = 100_000)]
    packets_per_run: u64,
    /// Core to pin to (default: the last one).
    #[arg(long)]
    core: Option<usize>,
    /// Only these paths (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    path: Vec<Path>,
    /// Only these modes: cheetah, hash, maglev.
    #[arg(long, value_delimiter = ',', value_parser = Mode::from_str)]
    mode: Vec<Mode>,
    /// Only these policies, for the per-policy SYN rows.
    #[arg(long, value_delimiter = ',', value_parser = PolicyKind::from_str)]
    policy: Vec<PolicyKind>,
    /// Time under SCHED_FIFO (root): ordinary processes stop preempting the benchmark on
    /// its core. For a machine shared with builds; dropped before the callgrind children.
    #[arg(long)]
    realtime: bool,
    /// Restore whole frames instead of headers before each use.
    #[arg(long)]
    full_restore: bool,
    /// Frames in the receive ring the packets are written into, reused pass after pass as
    /// a NIC ring or AF_XDP UMEM is; 0 gives every packet of the path a buffer of its own
    /// (the working set is then the whole trace).
    #[arg(long, default_value_t = packets::DEFAULT_RING_FRAMES)]
    ring_frames: usize,
    /// Call `Worker::process` once per packet, as the receive loop did before it took
    /// `Worker::process_batch` (the default: one call per burst of 32).
    #[arg(long)]
    per_packet: bool,
    /// Also count instructions per packet, re-running each row under callgrind.
    #[arg(long)]
    callgrind: bool,
    /// Run one row for `--iterations` packets with no timing (for callgrind).
    #[arg(long)]
    instructions_only: bool,
    /// Packets to run with --instructions-only (default: one pass over the path).
    #[arg(long)]
    iterations: Option<u64>,
    /// Print the tables as markdown.
    #[arg(long)]
    markdown: bool,
    /// Time the in-kernel path instead: bpf/xdp_lb.c under BPF_PROG_TEST_RUN, net of a
    /// trivial XDP program (root; see bench/xdp.rs). Uses --servers, --core, --realtime
    /// and --markdown.
    #[arg(long)]
    xdp: bool,
    /// With --xdp: timed runs of each program per row (and per stage of the breakdown);
    /// with --xdp-flows: at least this many per point.
    #[arg(long, default_value_t = 100_000)]
    xdp_runs: u32,
    /// Time the in-kernel path against the number of distinct flows instead (1 to 10^7:
    /// the cookie paths, the fallback table and a Katran-style LRU connection table; root; see
    /// bench/xdp_flows.rs). Uses --xdp-runs, --servers, --core, --realtime and --markdown.
    #[arg(long)]
    xdp_flows: bool,
    /// With --xdp-flows: the largest flow count timed (points are 1, 10^2, 10^3 .. 10^7).
    #[arg(long, default_value_t = 10_000_000)]
    xdp_flows_max: u32,
    /// With --xdp-flows: also draw the curves into this PNG.
    #[arg(long)]
    xdp_flows_plot: Option<std::path::PathBuf>,
    /// With --xdp: also time Katran's own XDP program, this object (built outside the
    /// repository by scripts/katran-build.sh), in the same run and by the same method
    /// (bench/xdp_katran.rs).
    #[arg(long)]
    xdp_katran: Option<std::path::PathBuf>,
    /// With --xdp: extra /32 routes through the clients' gateway around the bench's client
    /// (10.2.0.0/16), so that the next_hops trie is deep where the client's lookup goes.
    #[arg(long, default_value_t = 0)]
    xdp_routes: u32,
    /// With --xdp: only the SYN rows (one per policy), for a quick look at the policies.
    #[arg(long)]
    xdp_syn_only: bool,
    /// Count the packets per second the LB's XDP program forwards on a veth with one CPU,
    /// against an XDP_TX reflector on the same veth with the same sender (root; see
    /// bench/xdp_live.rs). Uses --servers and --markdown.
    #[arg(long)]
    xdp_live: bool,
    /// With --xdp-live: seconds each program is measured.
    #[arg(long, default_value_t = 5.0)]
    xdp_live_seconds: f64,
    /// With --xdp-live: seconds of traffic before each measurement.
    #[arg(long, default_value_t = 1.0)]
    xdp_live_warm_up: f64,
    /// With --xdp-live: connections (client source ports) the sender cycles over.
    #[arg(long, default_value_t = 1_024)]
    xdp_live_flows: u32,
    /// With --xdp-live: the CPU the LB's veth NAPI (and so its XDP program) runs on
    /// (default: the last one).
    #[arg(long)]
    xdp_live_lb_cpu: Option<usize>,
    /// With --xdp-live: the CPU the sender runs on (default: 0).
    #[arg(long)]
    xdp_live_sender_cpu: Option<usize>,
    /// With --xdp-live: prefix of its namespaces and interfaces (at most 3 characters).
    #[arg(long, default_value = "xl")]
    xdp_live_prefix: String,
    /// With --xdp-live: leave the LB's NAPI thread under the normal scheduler (by default
    /// it is SCHED_FIFO, so that other processes on its CPU do not take it away).
    #[arg(long)]
    xdp_live_fair: bool,
    /// With --xdp-live: how the LB's veth NAPI is put on the LB's CPU: napi-thread
    /// (threaded NAPI, pinned) or cpumap (the sender's frames cross to that CPU first).
    #[arg(long, value_enum, default_value = "napi-thread")]
    xdp_live_steer: xdp_live::Steer,
    /// Time one publication of the tables into the XDP program's maps instead (the
    /// daemon's main thread, on every change and once a second; see bench/publisher.rs).
    /// Uses --servers and --markdown.
    #[arg(long)]
    publisher: bool,
    /// With --publisher: VIPs in the tables.
    #[arg(long, default_value_t = 200)]
    publisher_vips: u16,
    /// With --publisher: publications timed per row.
    #[arg(long, default_value_t = 11)]
    publisher_runs: u32,
}

impl Args {
    fn trace_config(&self) -> TraceConfig {
        TraceConfig {
            flows: self.flows,
            concurrency: self.concurrency,
            seed: self.seed,
            no_ts_share: self.no_ts_share,
        }
    }

    /// The arguments a callgrind child needs to build the very same trace.
    fn trace_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--flows={}", self.flows),
            format!("--concurrency={}", self.concurrency),
            format!("--servers={}", self.servers),
            format!("--seed={}", self.seed),
            format!("--no-ts-share={}", self.no_ts_share),
            format!("--trace-policy={}", self.trace_policy.name()),
            format!("--ring-frames={}", self.ring_frames),
        ];
        if self.full_restore {
            args.push("--full-restore".into());
        }
        if self.per_packet {
            args.push("--per-packet".into());
        }
        args
    }

    fn selected(&self) -> Vec<Item> {
        items::all()
            .into_iter()
            .filter(|i| self.path.is_empty() || self.path.contains(&i.path))
            .filter(|i| self.mode.is_empty() || self.mode.contains(&i.mode))
            .filter(|i| self.policy.is_empty() || i.policy.is_none_or(|p| self.policy.contains(&p)))
            .collect()
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.publisher {
        return publisher::run(publisher::Options {
            servers: args.servers,
            vips: args.publisher_vips,
            runs: args.publisher_runs,
            markdown: args.markdown,
        });
    }
    if args.xdp_flows {
        return xdp_flows::run(xdp_flows::Options {
            runs: args.xdp_runs,
            servers: args.servers,
            core: args.core,
            realtime: args.realtime,
            markdown: args.markdown,
            max_flows: args.xdp_flows_max,
            plot: args.xdp_flows_plot,
        });
    }
    if args.xdp_live {
        return xdp_live::run(xdp_live::Options {
            steer: args.xdp_live_steer,
            seconds: args.xdp_live_seconds,
            warm_up: args.xdp_live_warm_up,
            flows: args.xdp_live_flows,
            lb_cpu: args.xdp_live_lb_cpu,
            sender_cpu: args.xdp_live_sender_cpu,
            servers: args.servers,
            prefix: args.xdp_live_prefix,
            fair: args.xdp_live_fair,
            markdown: args.markdown,
        });
    }
    if args.xdp {
        return xdp::run(xdp::Options {
            runs: args.xdp_runs,
            routes: args.xdp_routes,
            katran: args.xdp_katran,
            syn_only: args.xdp_syn_only,
            servers: args.servers,
            core: args.core,
            realtime: args.realtime,
            markdown: args.markdown,
        });
    }
    ensure!(
        args.flows > 0 && args.concurrency > 0,
        "--flows and --concurrency must be > 0"
    );
    ensure!(
        (0.0..=1.0).contains(&args.no_ts_share),
        "--no-ts-share is a share in 0..=1"
    );
    let items = args.selected();
    ensure!(!items.is_empty(), "no row matches --path/--mode/--policy");
    let mut traces = Traces {
        config: args.trace_config(),
        servers: args.servers,
        by_mode: Vec::new(),
    };

    if args.instructions_only {
        let [item] = items[..] else {
            bail!(
                "--instructions-only runs one row, and {} match: {}",
                items.len(),
                items.iter().map(Item::label).collect::<Vec<_>>().join(", ")
            );
        };
        let trace = &traces.get(item.mode, args.trace_policy)?.trace;
        let n = args
            .iterations
            .unwrap_or(rows::item_count(&item, trace) as u64);
        Subject::prepare(&item, &args, &mut traces)?.run_for_instructions(n);
        println!("{}: {n} packets, untimed", item.label());
        return Ok(());
    }

    ensure!(
        args.runs >= timing::MIN_RUNS,
        "--runs must be at least 5 (the median of 5 runs or more)"
    );
    let core = args.core.unwrap_or_else(affinity::default_core);
    let (pin, pinned) = match affinity::pin_to(core) {
        Ok(pin) => (Some(pin), format!("pinned to core {core}")),
        Err(e) => {
            eprintln!("warning: cannot pin to core {core} ({e}); figures will be noisier");
            (None, format!("NOT pinned ({e})"))
        }
    };
    let (rt, pinned) = if args.realtime {
        match affinity::realtime() {
            Ok(rt) => (Some(rt), format!("{pinned}, SCHED_FIFO")),
            Err(e) => {
                eprintln!("warning: cannot switch to SCHED_FIFO ({e})");
                (None, format!("{pinned}, SCHED_FIFO refused ({e})"))
            }
        }
    } else {
        (None, pinned)
    };
    let clock = Clock::calibrate(Duration::from_millis(300));
    let machine = machine_summary(&clock, &pinned);
    eprintln!("{machine}");

    let mut subjects = Vec::new();
    for item in &items {
        subjects.push(Subject::prepare(item, &args, &mut traces)?);
    }
    let mut timed: Vec<&mut dyn Timed> = subjects.iter_mut().flat_map(Subject::timed).collect();
    let started = Instant::now();
    let mut measured = timing::measure_all(&mut timed, args.runs, args.packets_per_run).into_iter();
    eprintln!("timed {} rows in {:.1?}", items.len(), started.elapsed());
    let mut rows = Vec::new();
    for (item, subject) in items.iter().zip(&mut subjects) {
        let of_row: Vec<Measurement> = measured.by_ref().take(subject.timed().len()).collect();
        let row = subject.row(*item, &of_row);
        eprintln!(
            "{:<32} {:>7.2} ns/pkt {:>7.1} ticks (min {:.1}, max {:.1}; {} of {} runs disturbed)",
            item.label(),
            clock.ns(row.timing.net.median),
            row.timing.net.median,
            row.timing.net.min,
            row.timing.net.max,
            row.timing.preempted,
            row.timing.runs,
        );
        rows.push(row);
    }
    let drift = (clock.rate_since_start() / clock.ticks_per_ns - 1.0) * 100.0;
    if let Some(rt) = rt {
        rt.release();
    }
    if let Some(pin) = pin {
        pin.release();
    }

    let callgrind_note = if !args.callgrind {
        Some("Ir/pkt: run with --callgrind to count instructions per packet.".to_string())
    } else if !callgrind::available() {
        Some("Ir/pkt: skipped, valgrind is not installed (apt-get install valgrind).".to_string())
    } else {
        let jobs: Vec<callgrind::Job> = rows
            .iter()
            .map(|r| callgrind::Job {
                item: r.item,
                packets: r.count as u64,
            })
            .collect();
        let results = callgrind::run_all(&jobs, &args.trace_args(), affinity::cpus());
        let mut failed = 0;
        for (row, result) in rows.iter_mut().zip(results) {
            match result {
                Ok(ir) => row.ir = Some(ir),
                Err(_) => failed += 1,
            }
        }
        Some(format!(
            "Ir/pkt: callgrind instructions inside the measured function per packet (one pass over the path, restore excluded){}.",
            if failed > 0 {
                format!("; {failed} rows failed under valgrind")
            } else {
                String::new()
            }
        ))
    };

    let cheetah_trace = traces.by_mode.iter().find(|t| t.lab.mode == Mode::Cheetah);
    let ctx = report::Context {
        clock: &clock,
        trace_options: cheetah_trace.map(|t| t.options),
        callgrind_note,
        trace: cheetah_trace.map(|t| &t.trace),
    };
    let first_trace = &traces.by_mode[0].trace;
    println!("{machine}");
    println!("{}", trace_summary(first_trace));
    println!(
        "runs: {} per row, >= {} packets per run; restore: {} into {}; calls: {}; TSC rate drift over the run {drift:+.3}%",
        args.runs,
        args.packets_per_run,
        if args.full_restore { "whole frames" } else { "headers" },
        match args.ring_frames {
            0 => "a buffer per packet".to_string(),
            n => format!("a ring of {n} frames"),
        },
        if args.per_packet {
            "Worker::process per packet"
        } else {
            "Worker::process_batch per burst of 32"
        },
    );
    print!("{}", report::render(&rows, &ctx, args.markdown));
    Ok(())
}
