//! The API's JSON as types: the answers the handlers serialise and `cheetah ctl` (and the
//! lab) deserialise, and the request bodies. A field's place in its struct is its place
//! in the JSON, which `docs/api.md` documents: change neither without the other.
//!
//! Request bodies refuse unknown fields; an optional field left out takes its default (and
//! is left out when a client serialises one).

use std::collections::BTreeMap;
use std::net::IpAddr;

use cheetah_core::config::ConfiguredState;
use cheetah_core::policy::{LoadMetric, PolicyKind};
use serde::{Deserialize, Serialize};

// ---- answers ---------------------------------------------------------------------------

/// `GET /status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StatusView {
    pub version: String,
    pub mode: String,
    pub forwarding: String,
    /// The cookie layout: k epoch bits, 16 - k id bits (README, `cookie_epoch_bits`).
    pub cookie_epoch_bits: u8,
    /// Longest idle gap the layout lets a connection survive, in seconds.
    pub idle_limit_secs: f64,
    pub secret_fingerprint: String,
    pub uptime_secs: u64,
    pub started_at_unix_ms: u64,
    pub snapshot_generation: u64,
    pub interfaces: Vec<InterfaceView>,
    pub workers: Vec<WorkerView>,
    pub servers: ServerCounts,
    pub vips: usize,
    /// Whether this instance is ready for traffic (`GET /ready` says what it waits for).
    #[serde(default)]
    pub ready: bool,
}

impl StatusView {
    /// Whether the data path runs: the XDP program is attached and the workers' sockets are
    /// bound. The API answers before that (it binds first, so that a busy address stops a
    /// start with nothing changed); a client whose first SYN comes in that window reaches
    /// the LB host's kernel instead, which has no route to the VIP and answers "network
    /// unreachable". Whatever starts traffic after starting the LB waits for this.
    pub fn data_path_up(&self) -> bool {
        !self.interfaces.is_empty() && !self.workers.is_empty()
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct InterfaceView {
    pub name: String,
    pub ifindex: u32,
    pub xdp_mode: String,
    pub queues: Vec<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerView {
    pub index: usize,
    pub queue: u32,
    /// Packets the pipeline processed (every verdict).
    pub packets: u64,
    pub dropped: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub packets_per_second: f64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ServerCounts {
    pub active: usize,
    pub draining: usize,
    pub removed: usize,
}

/// One server: an element of `GET /servers`, and the answer to a change of one server.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ServerView {
    pub id: u16,
    pub dip: IpAddr,
    pub mac: Option<String>,
    pub state: String,
    pub quarantine_left_secs: Option<u64>,
    pub active_connections: u64,
    pub new_connections: u64,
    pub packets: u64,
    pub bytes: u64,
    pub reported_load: f64,
    /// VIPs whose pool it is in.
    pub vips: Vec<String>,
    /// This instance's health view of it, per VIP whose pool it is in.
    #[serde(default)]
    pub health: Vec<HealthView>,
    /// Whether one of this instance's probes confirmed its clock.
    #[serde(default)]
    pub clock_probed: bool,
}

/// A server's health on one VIP, as this instance's probes decided it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct HealthView {
    pub vip: String,
    /// `up`, `down` or `unknown`.
    pub state: String,
    /// The last probe's outcome (`syn-ack`, `refused`, `timeout`, `http 503`...), with
    /// the count toward a change while it disagrees with the state.
    pub reason: String,
    /// Seconds in this state.
    pub since_secs: u64,
}

/// `GET /ready`: 200 when ready, 503 when not, with what it waits for.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ReadyView {
    pub ready: bool,
    pub waiting: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ServersView {
    pub servers: Vec<ServerView>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct MemberView {
    pub id: u16,
    pub weight: u32,
    pub state: String,
}

/// One VIP: an element of `GET /vips`, and the answer to a change of one VIP.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct VipView {
    /// `address:port`, the key used in `/vips/{vip}/...`.
    pub vip: String,
    pub address: IpAddr,
    pub port: u16,
    pub backend_port: u16,
    pub policy: PolicyKind,
    pub metric: LoadMetric,
    pub members: Vec<MemberView>,
    /// Servers that left the pool but keep their connections.
    pub departed: Vec<u16>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct VipsView {
    pub vips: Vec<VipView>,
}

/// `POST /servers`: the new server's id.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct AddedView {
    pub id: u16,
}

/// Every error's body: `"<field>: <problem>"`, or what went wrong.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorView {
    pub error: String,
}

// ---- requests --------------------------------------------------------------------------

fn one() -> u32 {
    1
}

/// `POST /servers`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u16>,
    pub dip: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default)]
    pub vips: Vec<JoinVip>,
    /// `draining`: known to the data path, no new connections until activated.
    #[serde(default)]
    pub state: ConfiguredState,
}

/// A VIP a new server joins, with its weight there.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinVip {
    pub vip: String,
    #[serde(default = "one")]
    pub weight: u32,
}

/// `POST /servers/{id}/load`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadReport {
    /// The server's load in the operator's unit (CPU utilisation...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// The connections the server really has open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_connections: Option<u64>,
}

/// `PUT /vips/{vip}/policy`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPolicy {
    pub policy: PolicyKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<LoadMetric>,
}

/// `PUT /vips/{vip}/weights`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetWeights {
    /// Server id (a string, as JSON keys are) to weight.
    pub weights: BTreeMap<u16, u32>,
}

/// `POST /vips/{vip}/servers`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinPool {
    pub id: u16,
    #[serde(default = "one")]
    pub weight: u32,
}
