//! `cheetah testbed ...`: the command tree over the testbed itself (`up`, `status`, `down`,
//! `inject`, `reboot`) and the scenarios run on it (`churn`, `churn-report`, `agent`, `throughput`).
//! It lives apart from both so that neither imports the other's commands.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::bail;
use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::names::UnknownName;
use cheetah_core::policy::PolicyKind;

use crate::loadgen::parse_duration;
use crate::testbed::{inject, pool, ready, status, teardown, Options, ServerClocks, Topology};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Build the testbed, replacing any with the same prefix, start its nginx servers and
    /// write the LB's config and `testbed.json` into the state dir.
    Up(UpArgs),
    /// Show the testbed's namespaces, interfaces, nginx servers and files.
    Status(PrefixArg),
    /// Remove the testbed: its processes, namespaces and state dir. Fine if none exists.
    Down(DownArgs),
    /// The router's pool of LB instances: `join` adds an instance once its `GET /ready`
    /// answers 200, `leave` takes it out.
    Lb(LbArgs),
    /// Run the churn scenario on a testbed of its own: load through `cheetah run` while
    /// servers are added, drained and removed, the policy changes and the LB restarts;
    /// writes `<out>/<mode>.json` (docs/churn.md).
    Churn(crate::churn::ChurnArgs),
    /// Table and plot of a cheetah run and a hash run of the churn scenario.
    ChurnReport(crate::churn::ReportArgs),
    /// A server's load agent (run inside a server namespace): reports the server's open
    /// connections to the LB's API every second.
    Agent(crate::churn::AgentArgs),
    /// From inside a client namespace, send crafted frames toward a VIP: TCP segments with
    /// forged cookies, or malformed packets. Prints a JSON summary of what was sent.
    Inject(inject::InjectArgs),
    /// Reboot a server: every process in its namespace ends, its TCP timestamp clock
    /// restarts near 0 as a rebooted host's does, and nginx starts again.
    Reboot(RebootArgs),
    /// Requests/s, latency and the LB's CPU per packet: through cheetah, through hash mode,
    /// and straight to a server (a benchmark; results in docs/benchmarks.md).
    Throughput(crate::churn::ThroughputArgs),
}

#[derive(clap::Args)]
struct PrefixArg {
    /// Testbed name, the prefix of its namespaces (1 to 4 lowercase letters or digits).
    #[arg(long, default_value = "ch")]
    prefix: String,
}

#[derive(clap::Args)]
struct UpArgs {
    #[command(flatten)]
    prefix: PrefixArg,
    /// LB instances (1 to 8), each in a namespace of its own behind the router's ECMP
    /// route. With one it is in the router's pool from the start; with more, the pool
    /// starts empty and `cheetah testbed lb join` adds each once it is ready, and there is
    /// no c0 (a client on one instance's own segment could not get the replies that cross
    /// another).
    #[arg(long, default_value_t = 1)]
    lbs: u16,
    #[arg(long, default_value_t = 4)]
    servers: u16,
    /// Clients behind the router (c1..cN); c0 on the LB's own segment always exists.
    #[arg(long, default_value_t = 3)]
    clients: u16,
    /// l2 (servers hold the VIP on lo) or nat.
    #[arg(long, default_value = "l2", value_parser = Forwarding::from_str)]
    forwarding: Forwarding,
    /// cheetah, hash or maglev: the LB config's mode.
    #[arg(long, default_value = "cheetah", value_parser = Mode::from_str)]
    mode: Mode,
    /// The VIP's policy: rr, wrr, awrr, pow2, least-loaded, random, hash or maglev
    /// (round-robin, weighted-round-robin and power-of-two are accepted too).
    #[arg(long, default_value = "rr", value_parser = parse_policy)]
    policy: PolicyKind,
    /// State dir for the configs, logs and content [default: /run/cheetah-testbed/<prefix>].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// distinct: each server's TCP timestamps get an offset of their own (a tc program on
    /// its interface); shared: every server sends the host's one TCP clock.
    #[arg(long, default_value = "distinct", value_parser = parse_server_clocks)]
    server_clocks: ServerClocks,
    /// How many clients send no TCP timestamps (their namespace has
    /// net.ipv4.tcp_timestamps=0, as Windows clients): the last ones, c<n> first. The LB
    /// routes their connections by its fallback table, not by cookies.
    #[arg(long, default_value_t = 0)]
    clients_without_timestamps: u16,
}

#[derive(clap::Args)]
struct RebootArgs {
    #[command(flatten)]
    prefix: PrefixArg,
    /// The server, by name (`s2`).
    #[arg(long)]
    server: String,
    /// What its clock shows right after the reboot, in ms.
    #[arg(long, default_value_t = 5_000)]
    uptime_ms: u32,
}

#[derive(clap::Args)]
struct DownArgs {
    #[command(flatten)]
    prefix: PrefixArg,
    /// Keep the state dir (nginx error logs, the LB's config and state) for a post-mortem.
    #[arg(long)]
    keep_dir: bool,
}

#[derive(clap::Args)]
struct LbArgs {
    #[command(subcommand)]
    action: LbAction,
}

#[derive(clap::Subcommand)]
enum LbAction {
    /// Wait until the instance is ready (`GET /ready` answers 200: it knows every active
    /// server's clock and health), then add it to the router's ECMP pool.
    Join(JoinArgs),
    /// Take the instance out of the router's pool; its connections move to the others.
    Leave(InstanceArg),
}

#[derive(clap::Args)]
struct InstanceArg {
    #[command(flatten)]
    prefix: PrefixArg,
    /// The instance: 1 for `<prefix>-lb`, k for `<prefix>-lb<k>`.
    #[arg(long)]
    lb: u16,
}

#[derive(clap::Args)]
struct JoinArgs {
    #[command(flatten)]
    instance: InstanceArg,
    /// The instance's control API, as reachable inside its namespace.
    #[arg(long, default_value = crate::testbed::API_LISTEN)]
    api: String,
    /// How long to wait for readiness before giving up (the pool is then unchanged).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: std::time::Duration,
}

fn parse_server_clocks(text: &str) -> anyhow::Result<ServerClocks> {
    match text {
        "distinct" => Ok(ServerClocks::Distinct),
        "shared" => Ok(ServerClocks::Shared),
        _ => bail!("use distinct or shared"),
    }
}

/// The LB config's own policy names, plus the spelled-out forms people tend to type (only
/// here: the config file and the control API take the config's names alone).
fn parse_policy(text: &str) -> Result<PolicyKind, UnknownName> {
    let canonical = match text {
        "round-robin" => "rr",
        "weighted-round-robin" => "wrr",
        "auto-weighted-round-robin" => "awrr",
        "power-of-two" => "pow2",
        other => other,
    };
    canonical.parse()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::Up(up) => {
            let options = Options {
                prefix: up.prefix.prefix,
                lbs: up.lbs,
                servers: up.servers,
                clients: up.clients,
                forwarding: up.forwarding,
                mode: up.mode,
                policy: up.policy,
                dir: up.dir,
                server_clocks: up.server_clocks,
                clients_without_timestamps: up.clients_without_timestamps,
            };
            let topo = Topology::up(&options)?;
            print_summary(&topo);
            Ok(())
        }
        Action::Status(status) => status::print(&status.prefix),
        Action::Down(down) => teardown(&down.prefix.prefix, down.keep_dir),
        Action::Lb(lb) => run_lb(lb.action),
        Action::Churn(args) => crate::churn::run(args),
        Action::ChurnReport(args) => crate::churn::run_report(args),
        Action::Agent(args) => crate::churn::run_agent(args),
        Action::Inject(inject) => inject::run(inject),
        Action::Reboot(reboot) => {
            let mut topo = Topology::of_prefix(&reboot.prefix.prefix)?;
            let (before, after) = topo.reboot_server(&reboot.server, reboot.uptime_ms)?;
            println!(
                "{} rebooted: its TSval went from {before} to {after}",
                reboot.server
            );
            Ok(())
        }
        Action::Throughput(args) => crate::churn::run_throughput(args),
    }
}

fn run_lb(action: LbAction) -> anyhow::Result<()> {
    match action {
        LbAction::Join(join) => {
            let topo = Topology::of_prefix(&join.instance.prefix.prefix)?;
            let lb = topo.lb_instance(join.instance.lb)?;
            ready::wait(lb, &join.api, join.timeout)?;
            pool::join(&topo, lb)?;
            print_pool(&topo)
        }
        LbAction::Leave(leave) => {
            let topo = Topology::of_prefix(&leave.prefix.prefix)?;
            pool::leave(&topo, topo.lb_instance(leave.lb)?)?;
            print_pool(&topo)
        }
    }
}

fn print_pool(topo: &Topology) -> anyhow::Result<()> {
    let members: Vec<String> = pool::members(topo)?
        .iter()
        .map(|lb| format!("{} ({})", lb.instance, lb.namespace))
        .collect();
    if members.is_empty() {
        println!("router pool of {}: empty", topo.prefix);
    } else {
        println!("router pool of {}: {}", topo.prefix, members.join(", "));
    }
    Ok(())
}

fn print_summary(topo: &Topology) {
    println!(
        "testbed {} is up: {} LB instance(s), {} servers, {} clients, {} forwarding, VIP {}:{}",
        topo.prefix,
        1 + topo.more_lbs.len(),
        topo.servers.len(),
        topo.clients.len(),
        topo.forwarding.name(),
        topo.vip,
        topo.vip_port
    );
    for lb in topo.lbs() {
        let ends: Vec<String> = lb
            .interfaces()
            .iter()
            .map(|end| format!("{} {}", end.interface, end.cidr().unwrap_or_default()))
            .collect();
        println!("  LB namespace {} ({})", lb.namespace, ends.join(", "));
    }
    let without: Vec<&str> = topo
        .clients
        .iter()
        .filter(|c| !c.timestamps)
        .map(|c| c.name.as_str())
        .collect();
    if !without.is_empty() {
        println!("  no TCP timestamps at {}", without.join(", "));
    }
    println!("  LB config    {}", topo.files.config.display());
    println!("  summary      {}", topo.files.summary.display());
    if topo.more_lbs.is_empty() {
        if let Some(client) = topo.client(1).or_else(|| topo.client(0)) {
            println!(
                "  once the LB runs in {}: ip netns exec {} curl http://{}/small",
                topo.lb.namespace, client.namespace, topo.vip
            );
        }
    } else {
        println!("  the router's pool is empty: in each LB namespace, start");
        for lb in topo.lbs() {
            let state_dir = if lb.instance == 1 {
                String::new()
            } else {
                format!(" --state-dir {}", lb.state_dir.display())
            };
            println!(
                "    ip netns exec {} cheetah run --config {}{state_dir}",
                lb.namespace,
                topo.files.config.display()
            );
        }
        println!(
            "  then `cheetah testbed lb join --prefix {} --lb <k>` for each (it waits until the instance is ready)",
            topo.prefix
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_take_the_configs_names_and_spelled_out_ones() {
        for kind in PolicyKind::ALL {
            assert_eq!(parse_policy(kind.name()).unwrap(), kind);
        }
        assert_eq!(parse_policy("round-robin").unwrap(), PolicyKind::RoundRobin);
        assert_eq!(
            parse_policy("power-of-two").unwrap(),
            PolicyKind::PowerOfTwo
        );
        let error = parse_policy("fastest").unwrap_err().to_string();
        assert!(error.contains("least-loaded"), "{error}");
    }
}
