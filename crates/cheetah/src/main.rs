//! `cheetah`: the one binary. It parses the command line and hands each subcommand to the
//! crate that owns it: `run` and `ctl` to the daemon, `sim` to the simulator, the rest to
//! the lab (docs/architecture.md).

use cheetah_daemon::{ctl, run};
use cheetah_lab::{bench, loadgen, replay, testbed_cli};
use clap::{Parser, Subcommand};

/// cheetah: an L4 load balancer that never breaks a connection when servers or load
/// balancers come and go, whatever policy places new connections.
#[derive(Parser)]
#[command(name = "cheetah", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the load balancer on real interfaces (AF_XDP), with its control API.
    Run(run::Args),
    /// Run the pipeline over a pcap and write what the LB would have sent, with a
    /// per-packet verdict log.
    Replay(replay::Args),
    /// Measure the per-packet cost of the pipeline on a generated trace.
    Bench(bench::Args),
    /// Simulate cheetah and other load balancers at scale (broken connections, imbalance).
    Sim(cheetah_sim::cli::Args),
    /// Build, inspect or remove the namespace testbed (clients, router, LB, servers).
    Testbed(testbed_cli::Args),
    /// Drive HTTP load through the LB and report every broken connection and why.
    Loadgen(loadgen::Args),
    /// Query and change a running daemon through its control API.
    Ctl(ctl::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run(args) => run::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Sim(args) => cheetah_sim::cli::run(args),
        Command::Testbed(args) => testbed_cli::run(args),
        Command::Loadgen(args) => loadgen::run(args),
        Command::Ctl(args) => ctl::run(args),
    }
}
