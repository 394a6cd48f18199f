//! `status`: what of a testbed exists right now, read from the system rather than from
//! the summary, so that it also describes a half-built or half-removed testbed.

use anyhow::bail;
use serde::Deserialize;

use super::clocks::{self, ServerClocks};
use super::lifecycle::summary_of;
use super::plan::{check_prefix, role_of, Role, Server, Topology};
use super::shell::Cmd;
use super::{netns, nginx, pool, server_clock, veth_xdp};

/// The parts of `ip -j addr show` that status prints.
#[derive(Deserialize)]
struct Link {
    ifname: String,
    #[serde(default)]
    operstate: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    addr_info: Vec<AddrInfo>,
}

#[derive(Deserialize)]
struct AddrInfo {
    family: String,
    local: String,
    prefixlen: u8,
}

pub fn print(prefix: &str) -> anyhow::Result<()> {
    check_prefix(prefix)?;
    let namespaces = netns::list(prefix)?;
    if namespaces.is_empty() {
        bail!("no testbed `{prefix}`: there is no namespace {prefix}-*");
    }
    let summary = summary_of(prefix);
    let topo = Topology::load(&summary);
    match &topo {
        Ok(topo) => {
            println!(
                "testbed {prefix}: {} LB instance(s), {} servers, {} clients, mode {}, {} forwarding, policy {}, VIP {}:{}",
                1 + topo.more_lbs.len(),
                topo.servers.len(),
                topo.clients.len(),
                topo.mode.name(),
                topo.forwarding.name(),
                topo.policy.name(),
                topo.vip,
                topo.vip_port
            );
            println!("  config   {}", topo.files.config.display());
            println!("  secret   {}", topo.files.secret.display());
            println!("  summary  {}", topo.files.summary.display());
            let pool = pool::members(topo).unwrap_or_default();
            for lb in topo.lbs() {
                let in_pool = pool.iter().any(|m| m.instance == lb.instance);
                println!(
                    "  LB {} in {}: state {}, {} the router's pool",
                    lb.instance,
                    lb.namespace,
                    lb.state_dir.display(),
                    if in_pool { "in" } else { "NOT in" }
                );
            }
            println!("  server clocks {}", topo.server_clocks.name());
        }
        Err(_) => println!(
            "testbed {prefix}: incomplete, no summary at {} (run `cheetah testbed down --prefix {prefix}`)",
            summary.display()
        ),
    }
    let drops = veth_xdp::drops(prefix)?;
    if drops.is_empty() {
        println!("  XDP drops on the LB's veths: none");
    }
    for drop in &drops {
        println!("  XDP DROPS on the LB's veths (frames lost; is GRO on at the peer?): {drop}");
    }
    for namespace in &namespaces {
        println!("{namespace}");
        for link in links(namespace)? {
            let addresses: Vec<String> = link
                .addr_info
                .iter()
                .filter(|a| a.family == "inet")
                .map(|a| format!("{}/{}", a.local, a.prefixlen))
                .collect();
            println!(
                "  {:<8} {:<8} {:<17} {}",
                link.ifname,
                link.operstate,
                link.address,
                addresses.join(" ")
            );
        }
        if let Some(Role::Server(_)) = role_of(prefix, namespace) {
            let pids = nginx::pids(namespace)?;
            if pids.is_empty() {
                println!("  nginx: NOT running");
            } else {
                let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
                println!("  nginx: running (pids {})", pids.join(" "));
            }
            let server = topo.as_ref().ok().and_then(|t| {
                Some((
                    t.server_clocks,
                    t.servers.iter().find(|s| &s.namespace == namespace)?,
                ))
            });
            if let Some((kind, server)) = server {
                print_clock(kind, server)?;
            }
        } else {
            let processes: Vec<String> = netns::pids(namespace)?
                .into_iter()
                .filter_map(|pid| Some(format!("{} {pid}", netns::process_name(pid)?)))
                .collect();
            if !processes.is_empty() {
                println!("  processes: {}", processes.join(", "));
            }
        }
    }
    Ok(())
}

/// The server's clock as the summary records it, and whether its tc programs are there.
fn print_clock(kind: ServerClocks, server: &Server) -> anyhow::Result<()> {
    let tsval = clocks::tsval_at(clocks::monotonic_ms(), server.clock_offset);
    let programs = match kind {
        ServerClocks::Shared => String::new(),
        ServerClocks::Distinct => {
            let attached: Vec<&str> = [
                ("egress", server_clock::EGRESS_PROGRAM),
                ("ingress", server_clock::INGRESS_PROGRAM),
            ]
            .into_iter()
            .filter_map(|(direction, program)| {
                let filters = Cmd::new("tc")
                    .args(["-n", &server.namespace, "filter", "show", "dev"])
                    .args([server.link.interface.as_str(), direction])
                    .run()
                    .unwrap_or_default();
                // The kernel keeps the first 15 characters of a program's name.
                filters
                    .contains(&program[..program.len().min(15)])
                    .then_some(direction)
            })
            .collect();
            match attached.len() {
                2 => ", tc programs on egress and ingress".into(),
                _ => format!(
                    ", tc programs NOT all attached (only: {})",
                    if attached.is_empty() {
                        "none".into()
                    } else {
                        attached.join(" ")
                    }
                ),
            }
        }
    };
    println!(
        "  clock: host + {} ms, TSval now {tsval:#010x} (MSB {:#06x}){programs}",
        server.clock_offset,
        tsval >> 16
    );
    Ok(())
}

fn links(namespace: &str) -> anyhow::Result<Vec<Link>> {
    let out = Cmd::new("ip")
        .args(["-j", "-n", namespace, "addr", "show"])
        .run()?;
    serde_json::from_str(&out)
        .map_err(|e| anyhow::anyhow!("cannot read `ip -j -n {namespace} addr show`: {e}"))
}
