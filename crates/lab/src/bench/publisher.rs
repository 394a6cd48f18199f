//! What one publication of the tables costs the daemon's main thread with the XDP data
//! path (`xdp_tables::wanted`): it runs on every change of the tables and once a second,
//! and a change's API answer waits for it (`published.rs`). Timed at a fleet's size: every
//! server's egress resolved (with NAT, from a neighbour table that holds all of them), NAT
//! backends for every VIP, and a wrr VIP whose pool is the whole fleet, its cycle written out on
//! the first publication and reused after (`WrrCycles`). Wall-clock time of the calls,
//! median and least of `runs`; no root needed, nothing written to the kernel.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::ensure;
use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use cheetah_core::lb::Ingress;
use cheetah_core::tables::ControlPlane;
use cheetah_daemon::dataplane::xdp_tables::{wanted_reusing, Publication, WrrCycles};
use cheetah_daemon::dataplane::Interface;

pub struct Options {
    pub servers: u16,
    pub vips: u16,
    pub runs: u32,
    pub markdown: bool,
}

/// The VIPs but the first share this many backend ports (NAT keeps an entry per server
/// and port), the first has its own.
const BACKEND_PORTS: u16 = 4;
/// Servers in the pool of each VIP but the first.
const POOL: u16 = 20;

fn dip(id: u16) -> Ipv4Addr {
    Ipv4Addr::new(10, 20, (id / 250) as u8, (id % 250 + 1) as u8)
}

/// A config of `servers` servers, VIP 0 wrr over all of them with weights 1 to 5, and
/// `vips - 1` rr VIPs of POOL servers each. l2 servers have their MACs configured (l2 needs
/// them; only the route is looked up); NAT servers have none, so each is resolved from the
/// neighbour table.
fn config(forwarding: &str, servers: u16, vips: u16) -> anyhow::Result<LbConfig> {
    let mut toml = format!("forwarding = \"{forwarding}\"\n");
    for id in 1..=servers {
        let _ = writeln!(toml, "[[servers]]\nid = {id}\ndip = \"{}\"", dip(id));
        if forwarding == "l2" {
            let [hi, lo] = id.to_be_bytes();
            let _ = writeln!(toml, "mac = \"02:ce:00:00:{hi:02x}:{lo:02x}\"");
        }
    }
    let all: Vec<String> = (1..=servers).map(|id| id.to_string()).collect();
    let weights: Vec<String> = (1..=servers)
        .map(|id| format!("\"{id}\" = {}", 1 + id % 5))
        .collect();
    let _ = writeln!(
        toml,
        "[[vips]]\naddress = \"10.0.0.100\"\nport = 1000\nbackend_port = 7999\npolicy = \"wrr\"\nservers = [{}]\nweights = {{ {} }}",
        all.join(","),
        weights.join(", ")
    );
    // NAT lets a server's backend port serve one VIP: the VIPs on one port have pools
    // apart.
    for v in 1..vips {
        let first = (v - 1) / BACKEND_PORTS * POOL;
        let pool: Vec<String> = (first + 1..=first + POOL)
            .map(|id| id.to_string())
            .collect();
        let _ = writeln!(
            toml,
            "[[vips]]\naddress = \"10.0.0.100\"\nport = {}\nbackend_port = {}\nservers = [{}]",
            1000 + v,
            8000 + (v - 1) % BACKEND_PORTS,
            pool.join(",")
        );
    }
    Ok(LbConfig::from_toml(&toml)?)
}

/// `/proc/net/route` with a default route and the servers' /16 on the server side.
const ROUTES: &str =
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
lb-c\t00000000\t01010A0A\t0003\t0\t0\t0\t00000000\t0\t0\t0
lb-s\t0000140A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
";

/// `/proc/net/arp` with a complete entry for every server.
fn neighbours(servers: u16) -> String {
    let mut arp = String::from(
        "IP address       HW type     Flags       HW address            Mask     Device\n",
    );
    for id in 1..=servers {
        let [hi, lo] = id.to_be_bytes();
        let _ = writeln!(
            arp,
            "{:<16} 0x1         0x2         02:ce:00:00:{hi:02x}:{lo:02x}     *        lb-s",
            dip(id).to_string()
        );
    }
    arp
}

struct Row {
    label: String,
    median: Duration,
    least: Duration,
}

fn summarize(label: String, mut times: Vec<Duration>) -> Row {
    times.sort();
    Row {
        label,
        median: times[times.len() / 2],
        least: times[0],
    }
}

pub fn run(options: Options) -> anyhow::Result<()> {
    ensure!(
        options.vips >= 1 && u32::from(options.vips - 1) <= u32::from(BACKEND_PORTS) * u32::from(options.servers / POOL),
        "--publisher-vips must be 1 to {} with --servers {} (VIPs on one backend port have pools of {POOL} apart)",
        1 + u32::from(BACKEND_PORTS) * u32::from(options.servers / POOL),
        options.servers
    );
    ensure!(options.runs >= 1, "--publisher-runs must be at least 1");
    let interfaces: Vec<Interface> = ["lb-c", "lb-s"]
        .iter()
        .enumerate()
        .map(|(i, name)| Interface {
            name: name.to_string(),
            ifindex: 10 + i as u32,
            mac: [2, 0xb0, 0, 0, 0, i as u8],
            slot: i as u32,
            queues: 1,
        })
        .collect();
    let arp = neighbours(options.servers);
    let mut rows = Vec::new();
    for forwarding in ["l2", "nat"] {
        let plane = ControlPlane::new(
            &config(forwarding, options.servers, options.vips)?,
            &Secret([5; 16]),
        )?;
        let snapshot = plane.shared().snapshot.load();
        let publication = Publication {
            snapshot: &snapshot,
            layout: plane.layout(),
            interfaces: &interfaces,
            sides: &[Ingress::ClientSide, Ingress::ServerSide],
            fast_path: true,
            fallback_sets: 64,
        };
        let time = |cycles: &mut WrrCycles| {
            let start = Instant::now();
            let wanted = wanted_reusing(&publication, ROUTES, &arp, cycles);
            let elapsed = start.elapsed();
            std::hint::black_box(wanted);
            elapsed
        };
        let mut first = Vec::new();
        let mut again = Vec::new();
        for _ in 0..options.runs {
            let mut cycles = WrrCycles::default();
            first.push(time(&mut cycles));
            again.push(time(&mut cycles));
        }
        rows.push(summarize(
            format!("{forwarding}: first publication (wrr cycle written out)"),
            first,
        ));
        rows.push(summarize(
            format!("{forwarding}: next publication, nothing changed"),
            again,
        ));
    }
    let title = format!(
        "Publication of the tables (xdp_tables::wanted): {} servers (NAT: resolved from as many neighbour entries), {} VIPs: a wrr one over every server, the others over {POOL} on {BACKEND_PORTS} backend ports; {} runs",
        options.servers, options.vips, options.runs
    );
    println!("{title}");
    if options.markdown {
        println!("\n| publication | median ms | least ms |\n| --- | --- | --- |");
    }
    for row in &rows {
        let (median, least) = (
            row.median.as_secs_f64() * 1e3,
            row.least.as_secs_f64() * 1e3,
        );
        if options.markdown {
            println!("| {} | {median:.2} | {least:.2} |", row.label);
        } else {
            println!(
                "  {:<50} median {median:>9.2} ms   least {least:>9.2} ms",
                row.label
            );
        }
    }
    Ok(())
}
