//! `cheetah loadgen`: the client of the end-to-end tests and the demo. It drives HTTP load
//! through the LB over real TCP and reports exactly which connections broke and why.
//!
//! Every long-lived session is one TCP connection, reused for request after request and
//! never silently reconnected: the first thing that goes wrong on it (a RST or other socket
//! error, an unanswered request, a response from a different server than the first, a bad
//! or short response) is recorded once as a broken connection, and only then does the
//! session open a new one. Short connections (one request each) are counted the same way.
//! docs/loadgen.md has the flags, the kinds of breakage and the report format.

mod breaks;
mod conn;
mod http;
mod progress;
mod report;
mod session;
mod short;
mod stats;
mod stop;
mod units;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use tokio::sync::watch;
use tokio::task::JoinSet;

use stats::{Class, Recorder};
// The churn scenario takes durations and rates the way loadgen does.
pub use units::{parse_duration, parse_rate};

/// Worker threads of the runtime: the load is I/O bound and shares a small machine with the
/// LB and the servers.
const WORKER_THREADS: usize = 2;
/// After the stop, how much longer than `--request-timeout` sessions get to finish the
/// request in flight and close.
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address of the service (the VIP): IP:port.
    #[arg(long)]
    target: SocketAddr,
    /// How long to run (like 60s, 5m); 0 runs until --stop-file appears.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Long-lived keep-alive sessions, each one connection sending a request every
    /// --keepalive-interval.
    #[arg(long, default_value_t = 100)]
    keepalive: usize,
    /// Time between two requests of a keep-alive session (starts are staggered over it).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    keepalive_interval: Duration,
    /// Sessions that wait --idle-gap between requests on their connection.
    #[arg(long, default_value_t = 0)]
    idle_sessions: usize,
    /// Time between two requests of an idle session.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    idle_gap: Duration,
    /// Short connections per second (connect, one request, close), like 50/s; 0 for none.
    #[arg(long, default_value = "50/s", value_parser = parse_rate)]
    short_rate: f64,
    /// Connections that download --download-path again and again for the whole run.
    #[arg(long, default_value_t = 0)]
    downloads: usize,
    /// What the download connections fetch.
    #[arg(long, default_value = "/large")]
    download_path: String,
    /// What keep-alive, idle and short connections fetch.
    #[arg(long, default_value = "/small")]
    path: String,
    /// A request unanswered this long (or a body that stops this long) breaks its
    /// connection (`timeout`); also the limit of a connect.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// Open a new connection after one breaks (`--reconnect false`: the session ends).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    reconnect: bool,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Print a line a second on stderr: elapsed, requests/s, live sessions, broken.
    #[arg(long)]
    progress: bool,
    /// Stop as soon as this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
}

/// What every connection needs to know.
pub struct Settings {
    pub target: SocketAddr,
    /// The `Host` header.
    pub host: String,
    pub request_timeout: Duration,
    pub reconnect: bool,
}

pub fn run(args: Args) -> Result<()> {
    check(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let report = runtime.block_on(drive(&args))?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    print!("{}", report::summary(&report, &args.target.to_string()));
    if let Some(path) = &args.report {
        let mut json = serde_json::to_string_pretty(&report)?;
        json.push('\n');
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn check(args: &Args) -> Result<()> {
    ensure!(
        !args.duration.is_zero() || args.stop_file.is_some(),
        "--duration 0 runs until --stop-file appears: give --stop-file"
    );
    ensure!(
        !args.request_timeout.is_zero(),
        "--request-timeout must be positive"
    );
    ensure!(
        args.keepalive == 0 || !args.keepalive_interval.is_zero(),
        "--keepalive-interval must be positive"
    );
    ensure!(
        args.idle_sessions == 0 || !args.idle_gap.is_zero(),
        "--idle-gap must be positive"
    );
    for path in [&args.path, &args.download_path] {
        if !path.starts_with('/') || path.contains(|c: char| c.is_whitespace()) {
            bail!("{path:?} is not a request path (like /small)");
        }
    }
    Ok(())
}

async fn drive(args: &Args) -> Result<report::Report> {
    let settings = Arc::new(Settings {
        target: args.target,
        host: args.target.to_string(),
        request_timeout: args.request_timeout,
        reconnect: args.reconnect,
    });
    // An unreachable target is a setup error, not a broken connection.
    match conn::connect(args.target, args.request_timeout).await {
        Ok(probe) => probe.close().await,
        Err(brk) => bail!(
            "target {} unreachable at start: {} ({})",
            args.target,
            brk.kind,
            brk.detail
        ),
    }

    let plans = plans(args);
    let rec = Arc::new(Recorder::new(plans.len()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    for plan in plans {
        tasks.spawn(session::run(
            plan,
            settings.clone(),
            rec.clone(),
            stop_rx.clone(),
        ));
    }
    tasks.spawn(short::run(
        args.short_rate,
        args.path.clone(),
        settings.clone(),
        rec.clone(),
        stop_rx.clone(),
    ));
    if args.progress {
        tasks.spawn(progress::run(rec.clone(), stop_rx.clone()));
    }

    let duration = (!args.duration.is_zero()).then_some(args.duration);
    stop::wait(rec.start, duration, args.stop_file.as_deref()).await;
    let elapsed = rec.start.elapsed();
    let started_at = std::time::SystemTime::now() - elapsed;
    let _ = stop_tx.send(true);
    let grace = args.request_timeout + STOP_GRACE;
    let finished =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    let unfinished = if finished.is_err() {
        let left = tasks.len() as u64;
        tasks.shutdown().await;
        left
    } else {
        0
    };

    let stats = rec.stats();
    let live = rec.live();
    Ok(report::build(
        settings_json(args),
        started_at,
        elapsed,
        &stats,
        &live,
        unfinished,
    ))
}

/// The long-lived sessions, starts staggered so requests spread evenly.
fn plans(args: &Args) -> Vec<session::Plan> {
    let classes = [
        (
            Class::Keepalive,
            args.keepalive,
            args.keepalive_interval,
            args.keepalive_interval,
            &args.path,
        ),
        (
            Class::Idle,
            args.idle_sessions,
            args.idle_gap,
            args.idle_gap.min(Duration::from_secs(1)),
            &args.path,
        ),
        (
            Class::Download,
            args.downloads,
            Duration::ZERO,
            Duration::from_secs(1),
            &args.download_path,
        ),
    ];
    let mut plans = Vec::new();
    for (class, count, gap, stagger, path) in classes {
        debug_assert!(class.is_long());
        for i in 0..count {
            plans.push(session::Plan {
                class,
                slot: plans.len(),
                start_delay: stagger.mul_f64(i as f64 / count as f64),
                gap,
                path: path.clone(),
            });
        }
    }
    plans
}

fn settings_json(args: &Args) -> serde_json::Value {
    serde_json::json!({
        "target": args.target.to_string(),
        "duration_s": args.duration.as_secs_f64(),
        "keepalive": args.keepalive,
        "keepalive_interval_s": args.keepalive_interval.as_secs_f64(),
        "idle_sessions": args.idle_sessions,
        "idle_gap_s": args.idle_gap.as_secs_f64(),
        "short_rate": args.short_rate,
        "downloads": args.downloads,
        "download_path": args.download_path,
        "path": args.path,
        "request_timeout_s": args.request_timeout.as_secs_f64(),
        "reconnect": args.reconnect,
        "stop_file": args.stop_file,
    })
}
