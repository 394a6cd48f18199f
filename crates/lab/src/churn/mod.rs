//! `cheetah testbed churn`: per-connection consistency with real TCP stacks under churn,
//! side by side with hashing (docs/churn.md).
//!
//! One run brings a testbed up, starts `cheetah run` in its LB namespace and a load agent
//! in every server namespace, drives many kinds of connections through the VIP with
//! `cheetah loadgen` from every client, and meanwhile adds and drains servers, removes
//! drained ones once empty, switches the policy (rr, pow2, awrr) and restarts the LB twice
//! (SIGTERM, then kill -9). The loadgens judge every connection; the runner merges their
//! reports into `<out>/<mode>.json`. `churn-report` turns a cheetah run and a hash run into
//! a table and a plot.

mod agent;
mod lb;
mod lbconfig;
mod load;
mod plot;
mod progress;
mod report;
mod results;
mod scenario;
mod schedule;
mod throughput;
mod tsclock;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::bail;
use cheetah_core::config::{Forwarding, Mode};

pub use agent::{run as run_agent, AgentArgs};
pub use report::{run as run_report, ReportArgs};
pub use throughput::{run as run_throughput, ThroughputArgs};

use crate::loadgen::{parse_duration, parse_rate};

/// Connections must cross two changes of the servers' timestamp MSB (every 65.5 s).
const MIN_FULL_DURATION: Duration = Duration::from_secs(140);
/// A long idle session's second request must come before the load stops: sessions start
/// within a second, and the request needs a moment.
const LONG_IDLE_MARGIN: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug)]
pub struct ChurnArgs {
    /// cheetah (cookies) or hash (`pool[hash % n]`, no cookies): the LB config's mode.
    #[arg(long, default_value = "cheetah", value_parser = parse_mode)]
    mode: Mode,
    /// Testbed servers; the LB starts with all but the last two, which the schedule adds.
    #[arg(long, default_value_t = 8)]
    servers: u16,
    /// How long the load runs; the schedule scales with it. At least 140 s so connections
    /// cross two changes of the servers' timestamp MSB (shorter runs warn).
    #[arg(long, default_value = "150s", value_parser = parse_duration)]
    duration: Duration,
    /// Testbed name and namespace prefix (1 to 4 lowercase letters or digits).
    #[arg(long, default_value = "chc")]
    prefix: String,
    /// l2 (servers hold the VIP) or nat.
    #[arg(long, default_value = "l2", value_parser = Forwarding::from_str)]
    forwarding: Forwarding,
    /// LB instances (1 to 8) behind the router's ECMP route, all on one config and key.
    /// With several, each joins the router's pool once ready, and the restarts take one
    /// instance at a time out of the pool and back in once ready; the results are
    /// `<mode>-<n>lbs.json`. Several instances mean no c0 (docs/testbed.md).
    #[arg(long, default_value_t = 1)]
    lbs: u16,
    /// Results folder: `<mode>.json` and `<mode>-logs/` (LB, agent and loadgen logs and
    /// the loadgens' own reports).
    #[arg(long, default_value = "results/churn")]
    out: PathBuf,
    /// Keep-alive sessions in all (a request a second each), split over the clients.
    #[arg(long, default_value_t = 240)]
    keepalive: usize,
    /// Idle sessions in all: a request every --idle-gap on one connection.
    #[arg(long, default_value_t = 24)]
    idle_sessions: usize,
    /// Time between two requests of an idle session: nothing is on the wire in between
    /// (the servers send no TCP keepalive probes) while pool changes, restarts and MSB
    /// changes happen.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    idle_gap: Duration,
    /// Long idle sessions in all: a request every --long-idle-gap on one connection, run by
    /// a second loadgen per client and counted as their own class (`idle_long`).
    #[arg(long, default_value_t = 16)]
    long_idle_sessions: usize,
    /// Time between two requests of a long idle session: longer than one period of the
    /// servers' timestamp MSB (65.5 s), so the client's PAWS check and the LB's restore
    /// meet a timestamp that old. Shorter than --duration, or no session crosses a gap
    /// (shorter runs warn). 100 s puts the second request just after the kill -9 restart.
    #[arg(long, default_value = "100s", value_parser = parse_duration)]
    long_idle_gap: Duration,
    /// Connections downloading /large (32 MiB) back to back, in all.
    #[arg(long, default_value_t = 2)]
    downloads: usize,
    /// Short connections per second (one request each), all clients together.
    #[arg(long, default_value = "40/s", value_parser = parse_rate)]
    short_rate: f64,
    /// How many clients send no TCP timestamps (net.ipv4.tcp_timestamps=0 in their
    /// namespace, as Windows clients), the last ones first (c3, c2...): the LB routes their
    /// connections by its fallback table, not by cookies. The results count them apart
    /// (`no_timestamps`).
    #[arg(long, default_value_t = 0)]
    clients_without_timestamps: u16,
    /// A status line while it runs (rewritten on a terminal, every 10 s in a log).
    #[arg(long)]
    progress: bool,
}

/// The scenario compares cookies with `pool[hash % n]`; maglev is not one of its runs.
fn parse_mode(text: &str) -> anyhow::Result<Mode> {
    match text.parse() {
        Ok(mode @ (Mode::Cheetah | Mode::Hash)) => Ok(mode),
        Ok(Mode::Maglev) | Err(_) => bail!("use cheetah or hash"),
    }
}

pub fn run(args: ChurnArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the churn scenario needs root: it builds a testbed and runs the LB (XDP)");
    }
    if args.duration < MIN_FULL_DURATION {
        eprintln!(
            "churn: --duration {:?} is under {:?}: connections may not cross two changes of the servers' timestamp MSB",
            args.duration, MIN_FULL_DURATION
        );
    }
    if args.long_idle_sessions > 0 && args.duration <= args.long_idle_gap + LONG_IDLE_MARGIN {
        eprintln!(
            "churn: --duration {:?} leaves no room for a --long-idle-gap of {:?}: the long idle sessions make one request each and cross no gap",
            args.duration, args.long_idle_gap
        );
    }
    let config = scenario::Config {
        mode: args.mode,
        servers: args.servers,
        duration: args.duration,
        prefix: args.prefix,
        forwarding: args.forwarding,
        lbs: args.lbs,
        out: args.out,
        workload: load::Workload {
            keepalive: args.keepalive,
            idle_sessions: args.idle_sessions,
            idle_gap: args.idle_gap,
            long_idle_sessions: args.long_idle_sessions,
            long_idle_gap: args.long_idle_gap,
            downloads: args.downloads,
            short_rate: args.short_rate,
        },
        clients_without_timestamps: args.clients_without_timestamps,
        progress: args.progress,
    };
    let path = scenario::run(&config)?;
    let text = std::fs::read_to_string(&path)?;
    let results: results::ChurnResults = serde_json::from_str(&text)?;
    println!("{}", report::one_line(&results));
    println!("results: {}", path.display());
    if results.interrupted {
        // A script running several scenarios (the demo) must stop here too.
        eprintln!("churn: interrupted; the results cover the load until then");
        std::process::exit(130);
    }
    Ok(())
}
