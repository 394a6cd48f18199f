//! The testbed's names, addresses and files, derived from the options alone.
//!
//! Nothing here touches the system: `up` builds what the plan says, `testbed.json` is the
//! plan serialized, and tests read names and addresses from that file instead of repeating
//! the numbering scheme.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::bail;
use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::policy::PolicyKind;
use serde::{Deserialize, Serialize};

use super::clocks::ServerClocks;
use super::Options;

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const VIP_PORT: u16 = 80;
/// Where state dirs go unless `--dir` says otherwise.
pub const RUN_DIR: &str = "/run/cheetah-testbed";
/// Namespace names are `<prefix>-<role>`; a short prefix keeps them readable in `ip` output.
pub const MAX_PREFIX_CHARS: usize = 4;
/// Server `j` is 10.20.0.(10+j) with MAC ..:02:<j>, so j must stay well below 245.
pub const MAX_SERVERS: u16 = 200;
/// Client `i` sits on 10.10.(10+i).0/24.
pub const MAX_CLIENTS: u16 = 200;
/// LB instance `k` links to the router on 10.10.k.0/24 and sits at 10.20.0.k on the servers'
/// bridge, below the first server (10.20.0.11) and c0's segment (10.10.9.0/24).
pub const MAX_LBS: u16 = 8;
/// The LB's veths have two queue pairs so that the data path can run two workers per port.
pub const LB_QUEUES: u8 = 2;
/// What the router routes to the LB: the VIP's /24.
pub const VIP_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 99, 0, 0), 24);
/// What the LB routes to the router: every client segment.
pub const CLIENT_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 10, 0, 0), 16);

/// One end of a veth pair, or a bridge port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub namespace: String,
    pub interface: String,
    /// IPv4 address; `None` for a bridge port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_len: Option<u8>,
    /// Set at creation where the LB config or tests must know it in advance; else random.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

impl Endpoint {
    fn new(namespace: &str, interface: &str) -> Self {
        Endpoint {
            namespace: namespace.to_string(),
            interface: interface.to_string(),
            address: None,
            prefix_len: None,
            mac: None,
        }
    }

    fn with_address(mut self, address: Ipv4Addr, prefix_len: u8) -> Self {
        self.address = Some(address);
        self.prefix_len = Some(prefix_len);
        self
    }

    fn with_mac(mut self, mac: String) -> Self {
        self.mac = Some(mac);
        self
    }

    /// `10.10.1.2/24`, as `ip addr add` takes it.
    pub fn cidr(&self) -> Option<String> {
        Some(format!("{}/{}", self.address?, self.prefix_len?))
    }
}

/// A veth pair: `a` is created in its namespace, `b` is created directly in its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Veth {
    pub a: Endpoint,
    pub b: Endpoint,
    pub queues: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Files {
    pub dir: PathBuf,
    /// The LB's config, `cheetah run --config` reads it.
    pub config: PathBuf,
    pub secret: PathBuf,
    /// Content every server serves (`/small`, `/large`).
    pub www: PathBuf,
    /// This plan as JSON.
    pub summary: PathBuf,
}

/// One LB instance (a host running `cheetah run`). Every instance has the same interface
/// names in its own namespace, so one config file fits them all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lb {
    /// 1..=N, as `--lb` names it.
    pub instance: u16,
    /// `<prefix>-lb` for the first instance, `<prefix>-lb<k>` for the others.
    pub namespace: String,
    /// `lb-c`, towards the router and the clients behind it.
    pub client_side: Endpoint,
    /// `lb-s`, on the servers' bridge.
    pub server_side: Endpoint,
    /// `lb-l`, to client c0 on the LB's own segment: only in a one-instance testbed (a
    /// client behind one instance could not get the replies that cross another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_side: Option<Endpoint>,
    /// The router's end of `lb-c`: `rt-lb`, `rt-lb<k>`.
    pub router_side: Endpoint,
    /// The bridge port of `lb-s`: `sw-lb`, `sw-lb<k>`.
    pub switch_port: Endpoint,
    /// The instance's own state folder: `[daemon] state_dir` of the config for the first,
    /// `cheetah run --state-dir` for the others.
    pub state_dir: PathBuf,
}

impl Lb {
    /// The interfaces `cheetah run` serves, as the config lists them.
    pub fn interfaces(&self) -> Vec<&Endpoint> {
        [&self.client_side, &self.server_side]
            .into_iter()
            .chain(&self.local_side)
            .collect()
    }

    /// The address the router's pool names this instance by.
    pub fn next_hop(&self) -> Ipv4Addr {
        self.client_side.address.expect("lb-c has an address")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Router {
    pub namespace: String,
    /// `rt-c<i>` for clients 1..=n.
    pub client_sides: Vec<Endpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switch {
    pub namespace: String,
    pub bridge: String,
    /// `sw-s<j>` for servers 1..=n.
    pub server_ports: Vec<Endpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Server {
    /// The server id in the LB config (and in cookies).
    pub id: u16,
    /// `s<j>`, also the value of the `X-Server` header.
    pub name: String,
    pub namespace: String,
    pub dip: Ipv4Addr,
    pub mac: String,
    pub link: Endpoint,
    /// The first LB instance's server side; with several, the server's default route
    /// spreads over all of them.
    pub gateway: Ipv4Addr,
    pub dir: PathBuf,
    pub nginx_conf: PathBuf,
    pub nginx_pid_file: PathBuf,
    pub error_log: PathBuf,
    /// What the server's tc program adds to the host's TCP clock, in ms: its TSval on the
    /// wire is (host CLOCK_MONOTONIC ms + this) mod 2^32. Set by `up` (`clocks.rs`).
    #[serde(default)]
    pub clock_offset: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    /// 0 for the client on the LB's own segment, 1.. behind the router.
    pub index: u16,
    pub name: String,
    pub namespace: String,
    pub address: Ipv4Addr,
    pub gateway: Ipv4Addr,
    pub link: Endpoint,
    /// Whether its TCP sends timestamps (`--clients-without-timestamps` turns them off).
    #[serde(default = "yes")]
    pub timestamps: bool,
}

fn yes() -> bool {
    true
}

/// The whole testbed: what `up` builds and `testbed.json` records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub prefix: String,
    pub mode: Mode,
    pub forwarding: Forwarding,
    pub policy: PolicyKind,
    pub vip: Ipv4Addr,
    pub vip_port: u16,
    pub files: Files,
    /// The first LB instance (the only one unless `--lbs`).
    pub lb: Lb,
    /// Instances 2..=N of `--lbs N`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_lbs: Vec<Lb>,
    pub router: Router,
    pub switch: Switch,
    pub servers: Vec<Server>,
    /// c0 first, then c1..=n.
    pub clients: Vec<Client>,
    /// Summaries from before this field describe testbeds whose servers all had the host's clock.
    #[serde(default = "shared_clocks")]
    pub server_clocks: ServerClocks,
}

fn shared_clocks() -> ServerClocks {
    ServerClocks::Shared
}

pub fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    let valid_chars = prefix
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_CHARS || !valid_chars {
        bail!(
            "prefix `{prefix}`: use 1 to {MAX_PREFIX_CHARS} lowercase letters or digits, e.g. `ch` or `t1`"
        );
    }
    Ok(())
}

/// The state dir of a prefix when `--dir` is not given.
pub fn default_dir(prefix: &str) -> PathBuf {
    Path::new(RUN_DIR).join(prefix)
}

pub fn namespace(prefix: &str, role: &str) -> String {
    format!("{prefix}-{role}")
}

/// What a testbed namespace is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// LB instance k (1 for `<prefix>-lb`).
    Lb(u16),
    Router,
    Switch,
    Server(u16),
    Client(u16),
}

/// The role of `name` if it is one of the namespaces a testbed with `prefix` creates.
/// Matching the roles exactly keeps `down --prefix t1` away from `t10-lb` and from anyone
/// else's `t1-x`.
pub fn role_of(prefix: &str, name: &str) -> Option<Role> {
    let role = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let numbered = |letter: char| {
        role.strip_prefix(letter)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok())
    };
    match role {
        "lb" => Some(Role::Lb(1)),
        "rt" => Some(Role::Router),
        "sw" => Some(Role::Switch),
        _ => lb_instance(role)
            .map(Role::Lb)
            .or_else(|| numbered('s').map(Role::Server))
            .or_else(|| numbered('c').map(Role::Client)),
    }
}

/// `lb<k>` for k in 2..=MAX_LBS: the first instance is plain `lb`, so `lb1` is nobody's.
fn lb_instance(role: &str) -> Option<u16> {
    let digits = role.strip_prefix("lb")?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let k: u16 = digits.parse().ok()?;
    (2..=MAX_LBS).contains(&k).then_some(k)
}

/// The namespace role of LB instance `k`.
fn lb_role(k: u16) -> String {
    if k == 1 {
        "lb".into()
    } else {
        format!("lb{k}")
    }
}

fn mac(group: u8, index: u16) -> String {
    format!("02:ce:00:00:{group:02x}:{index:02x}")
}

impl Topology {
    /// The plan for `options`, checked for limits; builds nothing.
    pub fn plan(options: &Options) -> anyhow::Result<Self> {
        let prefix = options.prefix.as_str();
        check_prefix(prefix)?;
        if options.servers == 0 || options.servers > MAX_SERVERS {
            bail!("--servers {}: use 1 to {MAX_SERVERS}", options.servers);
        }
        if options.clients > MAX_CLIENTS {
            bail!("--clients {}: use 0 to {MAX_CLIENTS}", options.clients);
        }
        if options.lbs == 0 || options.lbs > MAX_LBS {
            bail!("--lbs {}: use 1 to {MAX_LBS}", options.lbs);
        }
        // c0 sits on the LB's own segment, which only a one-instance testbed has.
        let first_client = u16::from(options.lbs > 1);
        let client_count = options.clients + 1 - first_client;
        if options.clients_without_timestamps > client_count {
            bail!(
                "--clients-without-timestamps {}: there are {client_count} clients (c{first_client} to c{})",
                options.clients_without_timestamps,
                options.clients
            );
        }
        // The last ones: c<n>, c<n-1>, ...
        let timestamps = |index: u16| index + options.clients_without_timestamps <= options.clients;
        let dir = options.dir.clone().unwrap_or_else(|| default_dir(prefix));
        let files = Files {
            config: dir.join("cheetah.toml"),
            secret: dir.join("secret"),
            www: dir.join("www"),
            summary: dir.join("testbed.json"),
            dir: dir.clone(),
        };

        let rt_ns = namespace(prefix, "rt");
        let sw_ns = namespace(prefix, "sw");
        let one_lb = options.lbs == 1;
        let mut lbs = (1..=options.lbs).map(|k| {
            let role = lb_role(k);
            let ns = namespace(prefix, &role);
            let index = u8::try_from(k).expect("MAX_LBS keeps this in range");
            let mac_base = 3 * (k - 1);
            Lb {
                instance: k,
                client_side: Endpoint::new(&ns, "lb-c")
                    .with_address(Ipv4Addr::new(10, 10, index, 2), 24)
                    .with_mac(mac(1, mac_base + 1)),
                server_side: Endpoint::new(&ns, "lb-s")
                    .with_address(Ipv4Addr::new(10, 20, 0, index), 24)
                    .with_mac(mac(1, mac_base + 2)),
                local_side: one_lb.then(|| {
                    Endpoint::new(&ns, "lb-l")
                        .with_address(Ipv4Addr::new(10, 10, 9, 1), 24)
                        .with_mac(mac(1, mac_base + 3))
                }),
                router_side: Endpoint::new(&rt_ns, &format!("rt-{role}"))
                    .with_address(Ipv4Addr::new(10, 10, index, 1), 24),
                switch_port: Endpoint::new(&sw_ns, &format!("sw-{role}")),
                state_dir: if k == 1 {
                    dir.join("state")
                } else {
                    dir.join(format!("state-{role}"))
                },
                namespace: ns,
            }
        });
        let lb = lbs.next().expect("--lbs is at least 1");
        let more_lbs: Vec<Lb> = lbs.collect();

        let mut clients = Vec::new();
        if one_lb {
            let c0_ns = namespace(prefix, "c0");
            clients.push(Client {
                index: 0,
                name: "c0".into(),
                address: Ipv4Addr::new(10, 10, 9, 2),
                gateway: Ipv4Addr::new(10, 10, 9, 1),
                link: Endpoint::new(&c0_ns, "eth0").with_address(Ipv4Addr::new(10, 10, 9, 2), 24),
                namespace: c0_ns,
                timestamps: timestamps(0),
            });
        }
        let mut client_sides = Vec::new();
        for i in 1..=options.clients {
            let name = format!("c{i}");
            let ns = namespace(prefix, &name);
            let subnet = u8::try_from(10 + i).expect("MAX_CLIENTS keeps this in range");
            let gateway = Ipv4Addr::new(10, 10, subnet, 1);
            let address = Ipv4Addr::new(10, 10, subnet, 2);
            client_sides
                .push(Endpoint::new(&rt_ns, &format!("rt-{name}")).with_address(gateway, 24));
            clients.push(Client {
                index: i,
                address,
                gateway,
                link: Endpoint::new(&ns, "eth0").with_address(address, 24),
                namespace: ns,
                name,
                timestamps: timestamps(i),
            });
        }
        let router = Router {
            client_sides,
            namespace: rt_ns,
        };

        let mut servers = Vec::new();
        let mut server_ports = Vec::new();
        for j in 1..=options.servers {
            let name = format!("s{j}");
            let ns = namespace(prefix, &name);
            let host = u8::try_from(10 + j).expect("MAX_SERVERS keeps this in range");
            let dip = Ipv4Addr::new(10, 20, 0, host);
            let server_mac = mac(2, j);
            let server_dir = dir.join(&name);
            server_ports.push(Endpoint::new(&sw_ns, &format!("sw-{name}")));
            servers.push(Server {
                id: j,
                dip,
                link: Endpoint::new(&ns, "eth0")
                    .with_address(dip, 24)
                    .with_mac(server_mac.clone()),
                mac: server_mac,
                gateway: Ipv4Addr::new(10, 20, 0, 1),
                nginx_conf: server_dir.join("nginx.conf"),
                nginx_pid_file: server_dir.join("nginx.pid"),
                error_log: server_dir.join("error.log"),
                dir: server_dir,
                namespace: ns,
                name,
                clock_offset: 0,
            });
        }
        let switch = Switch {
            bridge: "br0".into(),
            server_ports,
            namespace: sw_ns,
        };

        Ok(Topology {
            prefix: prefix.to_string(),
            mode: options.mode,
            forwarding: options.forwarding,
            policy: options.policy,
            vip: VIP,
            vip_port: VIP_PORT,
            files,
            lb,
            more_lbs,
            router,
            switch,
            servers,
            clients,
            server_clocks: options.server_clocks,
        })
    }

    /// Every namespace, in the order `up` creates them.
    pub fn namespaces(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.lbs().map(|lb| lb.namespace.as_str()).collect();
        names.extend([self.router.namespace.as_str(), &self.switch.namespace]);
        names.extend(self.servers.iter().map(|s| s.namespace.as_str()));
        names.extend(self.clients.iter().map(|c| c.namespace.as_str()));
        names
    }

    /// Every veth pair. The LB's ports have `LB_QUEUES` queues on both ends, because a
    /// veth delivers on the peer's rx queue matching the sender's tx queue.
    pub fn veths(&self) -> Vec<Veth> {
        let pair = |a: &Endpoint, b: &Endpoint, queues| Veth {
            a: a.clone(),
            b: b.clone(),
            queues,
        };
        let mut veths = Vec::new();
        for lb in self.lbs() {
            veths.push(pair(&lb.client_side, &lb.router_side, LB_QUEUES));
            veths.push(pair(&lb.server_side, &lb.switch_port, LB_QUEUES));
            if let (Some(local), Some(c0)) = (&lb.local_side, self.client(0)) {
                veths.push(pair(local, &c0.link, LB_QUEUES));
            }
        }
        let behind_router = self.clients.iter().filter(|c| c.index > 0);
        for (side, client) in self.router.client_sides.iter().zip(behind_router) {
            veths.push(pair(side, &client.link, 1));
        }
        for (port, server) in self.switch.server_ports.iter().zip(&self.servers) {
            veths.push(pair(port, &server.link, 1));
        }
        veths
    }

    /// Every LB instance, the first one first.
    pub fn lbs(&self) -> impl Iterator<Item = &Lb> {
        std::iter::once(&self.lb).chain(&self.more_lbs)
    }

    /// LB instance `k` (1-based, as `--lb` names it).
    pub fn lb_instance(&self, k: u16) -> anyhow::Result<&Lb> {
        self.lbs().find(|lb| lb.instance == k).ok_or_else(|| {
            anyhow::anyhow!(
                "--lb {k}: testbed `{}` has LB instances 1 to {}",
                self.prefix,
                1 + self.more_lbs.len()
            )
        })
    }

    #[allow(dead_code, reason = "library API, for callers that hold a Topology")]
    pub fn server(&self, id: u16) -> Option<&Server> {
        self.servers.iter().find(|s| s.id == id)
    }

    pub fn client(&self, index: u16) -> Option<&Client> {
        self.clients.iter().find(|c| c.index == index)
    }

    /// Reads the summary `up` wrote.
    pub fn load(summary: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(summary)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", summary.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a testbed summary: {e}", summary.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(prefix: &str, servers: u16, clients: u16) -> Options {
        Options {
            prefix: prefix.into(),
            servers,
            clients,
            ..Options::default()
        }
    }

    #[test]
    fn names_and_addresses_follow_the_documented_scheme() {
        let topo = Topology::plan(&options("t1", 12, 2)).unwrap();
        assert_eq!(topo.lb.namespace, "t1-lb");
        assert_eq!(topo.lb.client_side.cidr().unwrap(), "10.10.1.2/24");
        assert_eq!(
            topo.lb.server_side.mac.as_deref(),
            Some("02:ce:00:00:01:02")
        );
        let s12 = topo.server(12).unwrap();
        assert_eq!(s12.namespace, "t1-s12");
        assert_eq!(s12.dip, Ipv4Addr::new(10, 20, 0, 22));
        assert_eq!(s12.mac, "02:ce:00:00:02:0c");
        assert_eq!(topo.switch.server_ports[11].interface, "sw-s12");
        let c2 = topo.client(2).unwrap();
        assert_eq!(c2.address, Ipv4Addr::new(10, 10, 12, 2));
        assert_eq!(topo.router.client_sides[1].interface, "rt-c2");
        assert_eq!(topo.client(0).unwrap().gateway, Ipv4Addr::new(10, 10, 9, 1));
        assert_eq!(topo.namespaces().len(), 3 + 12 + 3);
        assert_eq!(topo.veths().len(), 3 + 2 + 12);
        assert!(topo.veths()[..3].iter().all(|v| v.queues == LB_QUEUES));
    }

    #[test]
    fn the_summary_round_trips_through_json() {
        let topo = Topology::plan(&options("ch", 4, 3)).unwrap();
        let text = serde_json::to_string_pretty(&topo).unwrap();
        assert_eq!(serde_json::from_str::<Topology>(&text).unwrap(), topo);
    }

    #[test]
    fn prefixes_and_counts_are_limited() {
        assert!(check_prefix("abcd").is_ok());
        for bad in ["", "abcde", "a-b", "Ab", "a b"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
        assert!(Topology::plan(&options("ch", 0, 1)).is_err());
        assert!(Topology::plan(&options("ch", MAX_SERVERS + 1, 1)).is_err());
        assert!(Topology::plan(&options("ch", 1, MAX_CLIENTS + 1)).is_err());
        assert!(Topology::plan(&options("ch", 1, 0)).is_ok());
        for lbs in [0, MAX_LBS + 1] {
            let error = Topology::plan(&Options {
                lbs,
                ..options("ch", 1, 1)
            })
            .unwrap_err()
            .to_string();
            assert!(
                error.contains(&format!("--lbs {lbs}: use 1 to 8")),
                "{error}"
            );
        }
    }

    #[test]
    fn several_lbs_each_get_their_own_links_with_the_same_interface_names() {
        let topo = Topology::plan(&Options {
            lbs: 3,
            ..options("t1", 2, 2)
        })
        .unwrap();
        let lbs: Vec<&Lb> = topo.lbs().collect();
        let namespaces: Vec<&str> = lbs.iter().map(|lb| lb.namespace.as_str()).collect();
        assert_eq!(namespaces, ["t1-lb", "t1-lb2", "t1-lb3"]);
        for (k, lb) in (1u8..).zip(&lbs) {
            assert_eq!(u8::try_from(lb.instance).unwrap(), k);
            let names: Vec<&str> = lb
                .interfaces()
                .iter()
                .map(|e| e.interface.as_str())
                .collect();
            assert_eq!(names, ["lb-c", "lb-s"], "one config fits every instance");
            assert_eq!(lb.next_hop(), Ipv4Addr::new(10, 10, k, 2));
            assert_eq!(lb.router_side.address, Some(Ipv4Addr::new(10, 10, k, 1)));
            assert_eq!(lb.server_side.address, Some(Ipv4Addr::new(10, 20, 0, k)));
        }
        assert_eq!(lbs[1].router_side.interface, "rt-lb2");
        assert_eq!(lbs[2].switch_port.interface, "sw-lb3");
        assert_eq!(lbs[1].state_dir, topo.files.dir.join("state-lb2"));
        let macs: std::collections::BTreeSet<_> = lbs
            .iter()
            .flat_map(|lb| [&lb.client_side.mac, &lb.server_side.mac])
            .collect();
        assert_eq!(macs.len(), 6, "every LB port has a MAC of its own");
        // No c0: a client on one instance's own segment would miss the replies crossing another.
        assert_eq!(topo.client(0), None);
        assert_eq!(topo.clients.len(), 2);
        assert_eq!(topo.namespaces().len(), 3 + 2 + 2 + 2);
        assert_eq!(topo.veths().len(), 3 * 2 + 2 + 2);
        assert!(topo.lb_instance(4).is_err());
        // The summary records every instance, the first where readers before `--lbs` look.
        let json = serde_json::to_value(&topo).unwrap();
        assert_eq!(json["lb"]["namespace"], "t1-lb");
        assert_eq!(json["more_lbs"][1]["namespace"], "t1-lb3");
        assert_eq!(serde_json::from_value::<Topology>(json).unwrap(), topo);
    }

    #[test]
    fn one_lb_keeps_the_names_and_addresses_from_before_several() {
        let topo = Topology::plan(&options("t1", 2, 1)).unwrap();
        assert!(topo.more_lbs.is_empty());
        let names: Vec<&str> = topo
            .lb
            .interfaces()
            .iter()
            .map(|e| e.interface.as_str())
            .collect();
        assert_eq!(names, ["lb-c", "lb-s", "lb-l"]);
        assert_eq!(topo.lb.router_side.cidr().unwrap(), "10.10.1.1/24");
        assert_eq!(topo.lb.router_side.interface, "rt-lb");
        assert_eq!(topo.lb.switch_port.interface, "sw-lb");
        assert_eq!(topo.lb.state_dir, topo.files.dir.join("state"));
        let json = serde_json::to_value(&topo).unwrap();
        assert!(json.get("more_lbs").is_none());
        assert_eq!(json["lb"]["local_side"]["address"], "10.10.9.1");
    }

    #[test]
    fn the_last_clients_go_without_timestamps() {
        let plan = |without| {
            Topology::plan(&Options {
                clients_without_timestamps: without,
                ..options("ch", 2, 3)
            })
        };
        let with =
            |topo: &Topology| -> Vec<bool> { topo.clients.iter().map(|c| c.timestamps).collect() };
        assert_eq!(with(&plan(0).unwrap()), [true; 4]);
        assert_eq!(with(&plan(1).unwrap()), [true, true, true, false]);
        assert_eq!(with(&plan(4).unwrap()), [false; 4]);
        assert!(plan(5).is_err());
        // Without c0 (several LB instances), c1..c3 are all the clients there are.
        let three = Topology::plan(&Options {
            lbs: 2,
            clients_without_timestamps: 3,
            ..options("ch", 2, 3)
        })
        .unwrap();
        assert_eq!(with(&three), [false; 3]);
        assert!(Topology::plan(&Options {
            lbs: 2,
            clients_without_timestamps: 4,
            ..options("ch", 2, 3)
        })
        .is_err());
        // Summaries from before the option: every client sent timestamps.
        let mut json = serde_json::to_value(plan(0).unwrap()).unwrap();
        json["clients"][1]
            .as_object_mut()
            .unwrap()
            .remove("timestamps");
        let old: Topology = serde_json::from_value(json).unwrap();
        assert!(old.clients[1].timestamps);
    }

    #[test]
    fn only_the_prefixes_own_roles_are_claimed() {
        assert_eq!(role_of("t1", "t1-lb"), Some(Role::Lb(1)));
        assert_eq!(role_of("t1", "t1-lb2"), Some(Role::Lb(2)));
        assert_eq!(role_of("t1", "t1-lb8"), Some(Role::Lb(MAX_LBS)));
        assert_eq!(role_of("t1", "t1-rt"), Some(Role::Router));
        assert_eq!(role_of("t1", "t1-sw"), Some(Role::Switch));
        assert_eq!(role_of("t1", "t1-s12"), Some(Role::Server(12)));
        assert_eq!(role_of("t1", "t1-c0"), Some(Role::Client(0)));
        for other in [
            "t10-lb", "t1-x", "t1-s", "t1-cx", "t1lb", "x-t1-lb", "t1-lb1", "t1-lb02", "t1-lb9",
            "t1-lbx", "t1-s+1",
        ] {
            assert_eq!(role_of("t1", other), None, "{other}");
        }
    }
}
