//! The load balancer's configuration: what operators write in TOML, and its validation.
//!
//! This module owns the LB sections of the config file (mode, forwarding, servers, VIPs).
//! The daemon owns its own sections (interfaces, API address, secret file) and hands the rest
//! here. Validation names the field and the problem, e.g.
//! `vips[1].servers[2]: server 9 is not defined in [[servers]]`, and a config that fails
//! validation changes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cookie::CookieLayout;
use crate::lb::fallback;
use crate::names::{find_by_name, UnknownName};
use crate::policy::{maglev, LoadMetric, PolicyKind};
use crate::types::{parse_mac, Mac, ServerId};

/// How the data path picks servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Policy for the first packet, cookie for the rest: per-connection consistency.
    #[default]
    Cheetah,
    /// Baseline: every packet goes to `pool[hash % n]`, no cookie.
    Hash,
    /// Baseline: every packet goes through the VIP's Maglev table, no cookie.
    Maglev,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Cheetah, Mode::Hash, Mode::Maglev];

    /// The name in the config file, on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Cheetah => "cheetah",
            Mode::Hash => "hash",
            Mode::Maglev => "maglev",
        }
    }
}

impl FromStr for Mode {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        find_by_name("mode", name, &Mode::ALL, Mode::name)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How packets reach the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Forwarding {
    /// Rewrite the destination MAC; servers own the VIP on `lo` and route replies via the LB.
    #[default]
    L2,
    /// Stateless NAT: VIP:port <-> DIP:backend_port, checksums updated.
    Nat,
}

impl Forwarding {
    pub const ALL: [Forwarding; 2] = [Forwarding::L2, Forwarding::Nat];

    /// The name in the config file, on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Forwarding::L2 => "l2",
            Forwarding::Nat => "nat",
        }
    }
}

impl FromStr for Forwarding {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        find_by_name("forwarding", name, &Forwarding::ALL, Forwarding::name)
    }
}

impl fmt::Display for Forwarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ConfiguredState {
    #[default]
    Active,
    Draining,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Id carried in cookies: below the layout's limit (0..=4095 by default), never reused
    /// while connections may carry it.
    pub id: u16,
    /// The server's own address (where NAT sends, and how NAT recognises its replies).
    pub dip: IpAddr,
    /// The server's MAC on the LB's segment (required for l2 forwarding).
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub state: ConfiguredState,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipConfig {
    pub address: IpAddr,
    pub port: u16,
    #[serde(default = "default_policy")]
    pub policy: PolicyKind,
    /// Load metric for pow2 / least-loaded / awrr (default: reported load for awrr, active
    /// connections otherwise).
    #[serde(default)]
    pub load_metric: Option<LoadMetric>,
    /// Server port for NAT (default: the VIP port).
    #[serde(default)]
    pub backend_port: Option<u16>,
    /// Ids of the servers in this VIP's pool.
    pub servers: Vec<u16>,
    /// Weights by server id (default 1), for wrr.
    #[serde(default)]
    pub weights: BTreeMap<String, u32>,
    /// How every LB instance probes this VIP's servers (`[vips.health]`).
    #[serde(default)]
    pub health: HealthConfig,
}

/// `[vips.health]`: the active health probes of one VIP's servers. Each LB instance probes
/// each server by itself, with a TCP SYN carrying the timestamp option (its SYN-ACK also
/// teaches the server's clock), or with an HTTP GET when `http_path` is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Between two probes of one server by one instance.
    #[serde(default = "default_health_interval_ms")]
    pub interval_ms: u64,
    /// How long a probe waits for its answer; below `interval_ms`.
    #[serde(default = "default_health_timeout_ms")]
    pub timeout_ms: u64,
    /// Failed probes in a row that take a server out.
    #[serde(default = "default_health_fall")]
    pub fall: u32,
    /// Successful probes in a row that put it back.
    #[serde(default = "default_health_rise")]
    pub rise: u32,
    /// The port probed (default: the VIP's backend port).
    #[serde(default)]
    pub port: Option<u16>,
    /// Check with `GET <http_path>` over HTTP/1.1 (2xx or 3xx is healthy) instead of a bare
    /// TCP handshake.
    #[serde(default)]
    pub http_path: Option<String>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval_ms: default_health_interval_ms(),
            timeout_ms: default_health_timeout_ms(),
            fall: default_health_fall(),
            rise: default_health_rise(),
            port: None,
            http_path: None,
        }
    }
}

fn default_health_interval_ms() -> u64 {
    1000
}
fn default_health_timeout_ms() -> u64 {
    500
}
fn default_health_fall() -> u32 {
    3
}
fn default_health_rise() -> u32 {
    2
}

/// Bounds of `[vips.health]`. Faster than 10 probes a second per server and instance loads
/// the servers for nothing; slower than once every 10 minutes is no health check.
pub const HEALTH_INTERVAL_MS: std::ops::RangeInclusive<u64> = 100..=600_000;
/// A timeout shorter than this would fail on a busy LAN.
pub const HEALTH_MIN_TIMEOUT_MS: u64 = 10;
pub const HEALTH_COUNT: std::ops::RangeInclusive<u32> = 1..=100;
pub const HEALTH_HTTP_PATH_MAX: usize = 1024;

impl HealthConfig {
    /// Checks the values; `field` is the table's path, e.g. `vips[0].health`.
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let at = |name: &str| format!("{field}.{name}");
        if !HEALTH_INTERVAL_MS.contains(&self.interval_ms) {
            return Err(ConfigError::new(
                at("interval_ms"),
                format!(
                    "must be between {} and {} ms, not {}",
                    HEALTH_INTERVAL_MS.start(),
                    HEALTH_INTERVAL_MS.end(),
                    self.interval_ms
                ),
            ));
        }
        if self.timeout_ms < HEALTH_MIN_TIMEOUT_MS || self.timeout_ms >= self.interval_ms {
            return Err(ConfigError::new(
                at("timeout_ms"),
                format!(
                    "must be at least {HEALTH_MIN_TIMEOUT_MS} ms and below interval_ms ({}), not {}",
                    self.interval_ms, self.timeout_ms
                ),
            ));
        }
        for (name, count) in [("fall", self.fall), ("rise", self.rise)] {
            if !HEALTH_COUNT.contains(&count) {
                return Err(ConfigError::new(
                    at(name),
                    format!(
                        "must be between {} and {} probes in a row, not {count}",
                        HEALTH_COUNT.start(),
                        HEALTH_COUNT.end()
                    ),
                ));
            }
        }
        if self.port == Some(0) {
            return Err(ConfigError::new(at("port"), "port 0 cannot be probed"));
        }
        if let Some(path) = &self.http_path {
            let printable = path.bytes().all(|b| b.is_ascii_graphic());
            if !path.starts_with('/') || !printable || path.len() > HEALTH_HTTP_PATH_MAX {
                return Err(ConfigError::new(
                    at("http_path"),
                    format!(
                        "`{}` is not a request path: it must start with `/` and hold at most {HEALTH_HTTP_PATH_MAX} printable ASCII characters, no spaces (percent-encode them)",
                        path.escape_debug()
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn default_policy() -> PolicyKind {
    PolicyKind::RoundRobin
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LbConfig {
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub forwarding: Forwarding,
    /// How many of the cookie's 16 bits carry the server's clock (the rest name the
    /// server): the longest idle gap a connection survives against the number of server
    /// ids ([`CookieLayout`]). Fixed at an LB's first start.
    #[serde(default = "default_epoch_bits")]
    pub cookie_epoch_bits: u8,
    /// Seconds a removed server's id stays retired before it may be given to a new server.
    #[serde(default = "default_quarantine")]
    pub quarantine_secs: u64,
    /// Entries of the fallback table for connections without TCP timestamps: one table
    /// shared by all workers, `capacity * 8` bytes; rounded up to a power of two, at least
    /// 8 (`lb/fallback.rs`).
    #[serde(default = "default_fallback_capacity")]
    pub fallback_table_capacity: usize,
    /// Slots of each VIP's Maglev table (a prime), which places connections without
    /// timestamps and every connection of `mode = "maglev"`. Fixed whatever the pool size,
    /// so that a server leaving moves only its own share of those connections.
    #[serde(default = "default_maglev_table_size")]
    pub maglev_table_size: usize,
    /// ICMP errors without a cookie copied to all servers: per-worker rate and burst.
    #[serde(default = "default_icmp_rate")]
    pub icmp_copy_rate: u64,
    #[serde(default = "default_icmp_burst")]
    pub icmp_copy_burst: u64,
    #[serde(default)]
    pub servers: Vec<ServerConfig>,
    #[serde(default)]
    pub vips: Vec<VipConfig>,
}

fn default_epoch_bits() -> u8 {
    CookieLayout::DEFAULT_EPOCH_BITS
}
fn default_quarantine() -> u64 {
    600
}
fn default_fallback_capacity() -> usize {
    fallback::DEFAULT_CAPACITY
}
fn default_maglev_table_size() -> usize {
    maglev::DEFAULT_TABLE_SIZE
}
fn default_icmp_rate() -> u64 {
    100
}
fn default_icmp_burst() -> u64 {
    50
}

/// A config that cannot be used, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Path of the offending field, e.g. `vips[0].servers[2]`.
    pub field: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "{}: {}", self.field, self.problem)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A server after validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidServer {
    pub id: ServerId,
    pub dip: u32,
    pub mac: Option<Mac>,
    pub state: ConfiguredState,
}

/// A VIP after validation.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidVip {
    pub address: IpAddr,
    pub port: u16,
    pub policy: PolicyKind,
    pub metric: LoadMetric,
    pub backend_port: u16,
    /// Pool members with their weights, in configured order.
    pub members: Vec<(ServerId, u32)>,
    /// Servers that left the pool but are not removed: their connections keep going, so in
    /// NAT mode their replies must still be recognised as this VIP's.
    pub departed: Vec<ServerId>,
    /// How its servers are probed (validated).
    pub health: HealthConfig,
}

impl ValidVip {
    /// The IPv4 address, or `None` for an IPv6 VIP (parsed, not yet balanced).
    pub fn ipv4(&self) -> Option<u32> {
        match self.address {
            IpAddr::V4(a) => Some(a.into()),
            IpAddr::V6(_) => None,
        }
    }

    /// The port its servers are probed on: the health table's, else the backend port.
    pub fn health_port(&self) -> u16 {
        self.health.port.unwrap_or(self.backend_port)
    }
}

impl LbConfig {
    /// Parses the LB sections from TOML text; unknown fields are errors.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let field = e.span().map(|s| locate(text, s.start)).unwrap_or_default();
            ConfigError::new(field, e.message().to_string())
        })
    }

    /// The cookie layout the config asks for.
    pub fn cookie_layout(&self) -> Result<CookieLayout, ConfigError> {
        CookieLayout::new(self.cookie_epoch_bits)
            .map_err(|e| ConfigError::new("cookie_epoch_bits", e.to_string()))
    }

    /// Checks everything that can be checked without the running system, returning the
    /// servers and VIPs in the form the control plane uses.
    pub fn validate(&self) -> Result<(Vec<ValidServer>, Vec<ValidVip>), ConfigError> {
        let layout = self.cookie_layout()?;
        if self.fallback_table_capacity == 0
            || self.fallback_table_capacity > fallback::MAX_CAPACITY
        {
            return Err(ConfigError::new(
                "fallback_table_capacity",
                format!("must be between 1 and {}", fallback::MAX_CAPACITY),
            ));
        }
        maglev::check_table_size(self.maglev_table_size, layout.server_ids())
            .map_err(|problem| ConfigError::new("maglev_table_size", problem))?;
        let mut servers = Vec::with_capacity(self.servers.len());
        let mut ids = HashSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            servers.push(validate_server(
                s,
                &format!("servers[{i}]"),
                self.forwarding,
                layout,
            )?);
            if !ids.insert(s.id) {
                return Err(ConfigError::new(
                    format!("servers[{i}].id"),
                    format!("server id {} is used twice", s.id),
                ));
            }
        }
        let mut vips = Vec::with_capacity(self.vips.len());
        let mut seen = HashSet::new();
        let mut nat_backends = NatBackends::default();
        for (i, v) in self.vips.iter().enumerate() {
            let field = format!("vips[{i}]");
            let vip = validate_vip(v, &field, &ids)?;
            if !seen.insert((vip.address, vip.port)) {
                return Err(ConfigError::new(
                    format!("{field}.port"),
                    format!("VIP {}:{} is defined twice", vip.address, vip.port),
                ));
            }
            if self.forwarding == Forwarding::Nat {
                for (j, (id, _)) in vip.members.iter().enumerate() {
                    let dip = servers.iter().find(|s| s.id == *id).map(|s| s.dip).unwrap();
                    if let Err(other) = nat_backends.claim(dip, vip.backend_port, i) {
                        return Err(ConfigError::new(
                            format!("{field}.servers[{j}]"),
                            format!(
                                "in nat mode {}:{} would serve vips[{other}] and vips[{i}]; replies could not be told apart (use another backend_port)",
                                std::net::Ipv4Addr::from(dip),
                                vip.backend_port
                            ),
                        ));
                    }
                }
            }
            vips.push(vip);
        }
        for (i, s) in servers.iter().enumerate() {
            if let Some(problem) = dip_is_a_vip_address(s.dip, &vips) {
                return Err(ConfigError::new(format!("servers[{i}].dip"), problem));
            }
        }
        Ok((servers, vips))
    }
}

/// A server's address may not be a VIP's: the LB would send the server its own VIP's
/// traffic (with NAT, every rewritten segment; health probes in either mode), and a
/// segment from the VIP's address could not be told from the server's reply. The problem
/// in words, if `dip` is one. Checked by the config's validation and by every
/// control-plane change.
pub(crate) fn dip_is_a_vip_address(dip: u32, vips: &[ValidVip]) -> Option<String> {
    vips.iter().find(|v| v.ipv4() == Some(dip)).map(|v| {
        format!(
            "{} is the address of VIP {}:{}; a server needs an address of its own",
            std::net::Ipv4Addr::from(dip),
            v.address,
            v.port
        )
    })
}

/// The NAT rule that a backend (a server's address and the VIP's backend port) serves one
/// VIP: a reply is matched to its VIP by its source alone (`Snapshot::nat_backend`), so two
/// VIPs on one backend could not be told apart. Checked by the config's validation and by
/// every control-plane change.
#[derive(Default)]
pub(crate) struct NatBackends {
    owner: HashMap<(u32, u16), usize>,
}

impl NatBackends {
    /// Files `dip:backend_port` as serving the VIP at index `vip`; `Err` with the index of
    /// the other VIP it serves already.
    pub(crate) fn claim(&mut self, dip: u32, backend_port: u16, vip: usize) -> Result<(), usize> {
        match self.owner.insert((dip, backend_port), vip) {
            Some(other) if other != vip => Err(other),
            _ => Ok(()),
        }
    }
}

pub(crate) fn validate_server(
    s: &ServerConfig,
    field: &str,
    forwarding: Forwarding,
    layout: CookieLayout,
) -> Result<ValidServer, ConfigError> {
    let id = server_id(s.id, layout)
        .map_err(|problem| ConfigError::new(format!("{field}.id"), problem))?;
    let dip = match s.dip {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(_) => {
            return Err(ConfigError::new(
                format!("{field}.dip"),
                "IPv6 servers are not supported yet",
            ))
        }
    };
    let mac = match &s.mac {
        Some(text) => Some(parse_mac(text).ok_or_else(|| {
            ConfigError::new(
                format!("{field}.mac"),
                format!("`{text}` is not a MAC address like 02:00:00:00:00:01"),
            )
        })?),
        None => None,
    };
    if forwarding == Forwarding::L2 && mac.is_none() {
        return Err(ConfigError::new(
            format!("{field}.mac"),
            "l2 forwarding needs each server's MAC address",
        ));
    }
    Ok(ValidServer {
        id,
        dip,
        mac,
        state: s.state,
    })
}

/// `id` as a server id, if the cookie `layout` can carry it; else the problem, in words.
pub fn server_id(id: u16, layout: CookieLayout) -> Result<ServerId, String> {
    ServerId::new(id).filter(|_| layout.holds(id)).ok_or_else(|| {
        format!(
            "{id} is above {}, the largest server id the cookie carries with cookie_epoch_bits = {} ({} ids for idle gaps up to {} s; fewer epoch bits carry more ids)",
            layout.max_server_id(),
            layout.epoch_bits(),
            layout.server_ids(),
            layout.max_idle_ms() / 1000
        )
    })
}

pub(crate) fn validate_vip(
    v: &VipConfig,
    field: &str,
    ids: &HashSet<u16>,
) -> Result<ValidVip, ConfigError> {
    if v.port == 0 {
        return Err(ConfigError::new(
            format!("{field}.port"),
            "port 0 is not a service port",
        ));
    }
    if v.backend_port == Some(0) {
        return Err(ConfigError::new(
            format!("{field}.backend_port"),
            "port 0 is not a service port",
        ));
    }
    let mut members = Vec::with_capacity(v.servers.len());
    for (j, id) in v.servers.iter().enumerate() {
        if !ids.contains(id) {
            return Err(ConfigError::new(
                format!("{field}.servers[{j}]"),
                format!("server {id} is not defined in [[servers]]"),
            ));
        }
        if members.iter().any(|(m, _): &(ServerId, u32)| m.0 == *id) {
            return Err(ConfigError::new(
                format!("{field}.servers[{j}]"),
                format!("server {id} is listed twice"),
            ));
        }
        members.push((ServerId(*id), 1));
    }
    for (key, weight) in &v.weights {
        let wfield = format!("{field}.weights.{key}");
        let id: u16 = key
            .parse()
            .map_err(|_| ConfigError::new(&wfield, "weights are keyed by server id"))?;
        let Some(member) = members.iter_mut().find(|(m, _)| m.0 == id) else {
            return Err(ConfigError::new(
                &wfield,
                format!("server {id} is not in this VIP's servers"),
            ));
        };
        if *weight == 0 {
            return Err(ConfigError::new(
                &wfield,
                "weight must be at least 1 (drain the server to stop new connections)",
            ));
        }
        member.1 = *weight;
    }
    v.health.validate(&format!("{field}.health"))?;
    Ok(ValidVip {
        address: v.address,
        port: v.port,
        policy: v.policy,
        metric: v.load_metric.unwrap_or_else(|| v.policy.default_metric()),
        backend_port: v.backend_port.unwrap_or(v.port),
        members,
        departed: Vec::new(),
        health: v.health.clone(),
    })
}

/// Best-effort `line N` for a TOML error offset, so a parse error says where it is.
fn locate(text: &str, offset: usize) -> String {
    let line = text[..offset.min(text.len())].matches('\n').count() + 1;
    format!("line {line}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        mode = "cheetah"
        forwarding = "l2"

        [[servers]]
        id = 1
        dip = "10.1.0.1"
        mac = "02:00:00:00:01:01"

        [[servers]]
        id = 2
        dip = "10.1.0.2"
        mac = "02:00:00:00:01:02"
        state = "draining"

        [[vips]]
        address = "10.0.0.100"
        port = 80
        policy = "wrr"
        servers = [1, 2]
        weights = { 2 = 3 }
    "#;

    #[test]
    fn good_config_validates() {
        let cfg = LbConfig::from_toml(GOOD).unwrap();
        let (servers, vips) = cfg.validate().unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1].state, ConfiguredState::Draining);
        assert_eq!(vips[0].members, vec![(ServerId(1), 1), (ServerId(2), 3)]);
        assert_eq!(vips[0].policy, PolicyKind::WeightedRoundRobin);
        assert_eq!(cfg.quarantine_secs, 600);
    }

    fn error_for(edit: impl Fn(&mut LbConfig)) -> ConfigError {
        let mut cfg = LbConfig::from_toml(GOOD).unwrap();
        edit(&mut cfg);
        cfg.validate().unwrap_err()
    }

    #[test]
    fn errors_name_the_field_and_the_problem() {
        let e = error_for(|c| c.vips[0].servers.push(9));
        assert_eq!(
            e.to_string(),
            "vips[0].servers[2]: server 9 is not defined in [[servers]]"
        );
        let e = error_for(|c| c.servers[1].id = 1);
        assert_eq!(e.field, "servers[1].id");
        let e = error_for(|c| c.servers[0].id = 40000);
        assert_eq!(
            e.to_string(),
            "servers[0].id: 40000 is above 4095, the largest server id the cookie carries with cookie_epoch_bits = 4 (4096 ids for idle gaps up to 524 s; fewer epoch bits carry more ids)"
        );
        // Fewer epoch bits, more ids: the same id fits with k = 2, and a width outside
        // the table is refused by name.
        let mut wide = LbConfig::from_toml(GOOD).unwrap();
        wide.cookie_epoch_bits = 2;
        wide.servers[0].id = 16_000;
        wide.vips[0].servers[0] = 16_000;
        assert!(wide.validate().is_ok(), "{:?}", wide.validate());
        let e = error_for(|c| c.servers[0].id = 4096);
        assert!(e.problem.starts_with("4096 is above 4095"), "{e}");
        let e = error_for(|c| c.cookie_epoch_bits = 1);
        assert_eq!(e.field, "cookie_epoch_bits");
        assert!(e.problem.contains("epoch bits go from 2"), "{e}");
        let e = error_for(|c| c.servers[0].mac = Some("nope".into()));
        assert_eq!(e.field, "servers[0].mac");
        let e = error_for(|c| c.servers[0].mac = None);
        assert!(e.problem.contains("l2 forwarding needs"), "{e}");
        let e = error_for(|c| {
            c.vips[0].weights.insert("1".into(), 0);
        });
        assert_eq!(e.field, "vips[0].weights.1");
        let e = error_for(|c| {
            let dup = c.vips[0].clone();
            c.vips.push(dup);
        });
        assert!(e.problem.contains("defined twice"), "{e}");
        let e = error_for(|c| c.maglev_table_size = 65_536);
        assert_eq!(
            e.to_string(),
            "maglev_table_size: must be a prime number, not 65536 (e.g. 65537, 131071, 262139, 1048573)"
        );
        let e = error_for(|c| c.maglev_table_size = 1021);
        assert_eq!(
            e.to_string(),
            "maglev_table_size: must be between 4096 (the number of server ids) and 16777213, not 1021"
        );
        let e = error_for(|c| c.servers[1].dip = "10.0.0.100".parse().unwrap());
        assert_eq!(
            e.to_string(),
            "servers[1].dip: 10.0.0.100 is the address of VIP 10.0.0.100:80; a server needs an address of its own"
        );
        let mut big = LbConfig::from_toml(GOOD).unwrap();
        big.maglev_table_size = 1_048_573;
        assert!(big.validate().is_ok(), "{:?}", big.validate());
    }

    #[test]
    fn health_has_defaults_and_reads_its_table() {
        let cfg = LbConfig::from_toml(GOOD).unwrap();
        let (_, vips) = cfg.validate().unwrap();
        assert_eq!(vips[0].health, HealthConfig::default());
        assert_eq!(
            (vips[0].health.interval_ms, vips[0].health.timeout_ms),
            (1000, 500)
        );
        assert_eq!((vips[0].health.fall, vips[0].health.rise), (3, 2));
        assert_eq!(vips[0].health_port(), 80, "the backend port by default");

        let text = format!(
            "{GOOD}\n        backend_port = 8080\n        [vips.health]\n        interval_ms = 2000\n        timeout_ms = 300\n        fall = 5\n        rise = 1\n        port = 8081\n        http_path = \"/healthz?full=1\"\n"
        );
        let cfg = LbConfig::from_toml(&text).unwrap();
        let (_, vips) = cfg.validate().unwrap();
        let health = &vips[0].health;
        assert_eq!((health.interval_ms, health.timeout_ms), (2000, 300));
        assert_eq!((health.fall, health.rise), (5, 1));
        assert_eq!(vips[0].health_port(), 8081);
        assert_eq!(health.http_path.as_deref(), Some("/healthz?full=1"));

        let e =
            LbConfig::from_toml(&format!("{GOOD}\n[vips.health]\nintervall_ms = 5\n")).unwrap_err();
        assert!(e.problem.contains("unknown field `intervall_ms`"), "{e}");
    }

    /// Every bad value of `[vips.health]` is refused, naming the field and the problem.
    #[test]
    fn bad_health_values_name_the_field() {
        let health = |edit: fn(&mut HealthConfig)| {
            error_for(move |c| {
                c.vips[0].health = HealthConfig::default();
                edit(&mut c.vips[0].health)
            })
            .to_string()
        };
        assert_eq!(
            health(|h| h.interval_ms = 0),
            "vips[0].health.interval_ms: must be between 100 and 600000 ms, not 0"
        );
        assert_eq!(
            health(|h| h.interval_ms = 600_001),
            "vips[0].health.interval_ms: must be between 100 and 600000 ms, not 600001"
        );
        assert_eq!(
            health(|h| h.timeout_ms = 1000),
            "vips[0].health.timeout_ms: must be at least 10 ms and below interval_ms (1000), not 1000"
        );
        assert_eq!(
            health(|h| h.timeout_ms = 5),
            "vips[0].health.timeout_ms: must be at least 10 ms and below interval_ms (1000), not 5"
        );
        assert_eq!(
            health(|h| h.fall = 0),
            "vips[0].health.fall: must be between 1 and 100 probes in a row, not 0"
        );
        assert_eq!(
            health(|h| h.rise = 101),
            "vips[0].health.rise: must be between 1 and 100 probes in a row, not 101"
        );
        assert_eq!(
            health(|h| h.port = Some(0)),
            "vips[0].health.port: port 0 cannot be probed"
        );
        for bad in ["healthz", "/a b", "/\r\nHost: x", ""] {
            let e = error_for(|c| c.vips[0].health.http_path = Some(bad.into()));
            assert_eq!(e.field, "vips[0].health.http_path", "{bad:?}");
            assert!(e.problem.contains("must start with `/`"), "{e}");
        }
        let e = error_for(|c| c.vips[0].health.http_path = Some(format!("/{}", "a".repeat(1024))));
        assert_eq!(e.field, "vips[0].health.http_path");
        // A negative number is a parse error with its line.
        let e = LbConfig::from_toml(&format!("{GOOD}\n[vips.health]\nfall = -1\n")).unwrap_err();
        assert!(e.field.starts_with("line "), "{e}");
    }

    #[test]
    fn nat_refuses_a_backend_shared_by_two_vips() {
        let e = error_for(|c| {
            c.forwarding = Forwarding::Nat;
            let mut other = c.vips[0].clone();
            other.port = 443;
            other.backend_port = Some(80);
            c.vips.push(other);
        });
        assert_eq!(e.field, "vips[1].servers[0]");
        assert!(
            e.problem
                .contains("10.1.0.1:80 would serve vips[0] and vips[1]"),
            "{e}"
        );
        // Distinct backend ports are fine.
        let mut cfg = LbConfig::from_toml(GOOD).unwrap();
        cfg.forwarding = Forwarding::Nat;
        let mut other = cfg.vips[0].clone();
        other.port = 443;
        cfg.vips.push(other);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn unknown_fields_and_bad_values_are_parse_errors_with_a_location() {
        let e = LbConfig::from_toml("mode = \"cheetah\"\nmood = 1\n").unwrap_err();
        assert!(e.problem.contains("unknown field `mood`"), "{e}");
        assert_eq!(e.field, "line 2");
        let e = LbConfig::from_toml("mode = \"round\"\n").unwrap_err();
        assert!(e.problem.contains("unknown variant `round`"), "{e}");
        let e = LbConfig::from_toml(
            "[[vips]]\naddress = \"10.0.0.1\"\nport = 80\npolicy = \"fastest\"\nservers = []\n",
        )
        .unwrap_err();
        assert!(e.problem.contains("fastest"), "{e}");
    }

    /// The config file's names (serde's) and `name()` are the same names.
    #[test]
    fn names_are_the_config_files_names() {
        fn config_name<T: Serialize>(value: T) -> String {
            toml::Value::try_from(value)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        }
        for mode in Mode::ALL {
            assert_eq!(config_name(mode), mode.name());
            assert_eq!(mode.name().parse(), Ok(mode));
        }
        for forwarding in Forwarding::ALL {
            assert_eq!(config_name(forwarding), forwarding.name());
            assert_eq!(forwarding.name().parse(), Ok(forwarding));
        }
        for policy in PolicyKind::ALL {
            assert_eq!(config_name(policy), policy.name());
        }
        let error = "maglev2".parse::<Mode>().unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"unknown mode "maglev2": use cheetah, hash or maglev"#
        );
        let error = "l3".parse::<Forwarding>().unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"unknown forwarding "l3": use l2 or nat"#
        );
    }
}
