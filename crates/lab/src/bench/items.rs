//! What the benchmark measures: one row per (path, mode, policy).

use cheetah_core::config::Mode;
use cheetah_core::policy::PolicyKind;

use super::trace::{Role, TracePacket};

/// A packet path through the pipeline, or a piece of it measured alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Path {
    /// Client SYNs (with timestamps): the VIP's policy places the connection.
    Syn,
    /// Client packets after the SYN: the cookie routes them.
    Established,
    /// Server -> client packets: the cookie goes into TSval.
    Server,
    /// Client SYNs without timestamps: Maglev and the fallback table.
    SynNoTs,
    /// Client packets of connections without timestamps: the fallback table.
    EstablishedNoTs,
    /// Server packets of connections without timestamps.
    ServerNoTs,
    /// The cookie stage as the FastClick element does it, on pre-parsed packets.
    Element,
    /// The keyed flow hash alone.
    Siphash,
    /// The Toeplitz (RSS) hash alone, for comparison.
    Toeplitz,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Syn => "syn",
            Path::Established => "established",
            Path::Server => "server",
            Path::SynNoTs => "syn-no-ts",
            Path::EstablishedNoTs => "established-no-ts",
            Path::ServerNoTs => "server-no-ts",
            Path::Element => "element",
            Path::Siphash => "siphash",
            Path::Toeplitz => "toeplitz",
        }
    }

    /// What a reader calls it.
    pub fn describe(self) -> &'static str {
        match self {
            Path::Syn => "client->server SYN",
            Path::Established => "client->server established",
            Path::Server => "server->client",
            Path::SynNoTs => "client->server SYN, no TS",
            Path::EstablishedNoTs => "client->server established, no TS",
            Path::ServerNoTs => "server->client, no TS",
            Path::Element => "element-equivalent (cookie stage)",
            Path::Siphash => "SipHash-1-3 (keyed PRF)",
            Path::Toeplitz => "Toeplitz (RSS)",
        }
    }

    /// Whether a trace packet belongs to this path.
    pub fn selects(self, packet: &TracePacket) -> bool {
        let ts = packet.timestamps;
        match self {
            Path::Syn => ts && packet.role == Role::ClientSyn,
            Path::Established | Path::Element => ts && packet.role == Role::ClientEstablished,
            Path::Server => ts && !packet.role.is_client(),
            Path::SynNoTs => !ts && packet.role == Role::ClientSyn,
            Path::EstablishedNoTs => !ts && packet.role == Role::ClientEstablished,
            Path::ServerNoTs => !ts && !packet.role.is_client(),
            Path::Siphash | Path::Toeplitz => false,
        }
    }
}

/// One row of the results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub path: Path,
    pub mode: Mode,
    /// The VIP policy, for SYN rows in cheetah mode (where it is what the SYN runs).
    pub policy: Option<PolicyKind>,
}

impl Item {
    pub fn label(&self) -> String {
        match self.policy {
            Some(policy) => format!(
                "{} {} {}",
                self.path.name(),
                self.mode.name(),
                policy.name()
            ),
            None => format!("{} {}", self.path.name(), self.mode.name()),
        }
    }
}

/// Every row, in report order.
pub fn all() -> Vec<Item> {
    let item = |path, mode, policy| Item { path, mode, policy };
    let mut items = Vec::new();
    for policy in PolicyKind::ALL {
        items.push(item(Path::Syn, Mode::Cheetah, Some(policy)));
    }
    items.push(item(Path::Syn, Mode::Hash, None));
    items.push(item(Path::Syn, Mode::Maglev, None));
    for path in [Path::Established, Path::Server] {
        for mode in Mode::ALL {
            items.push(item(path, mode, None));
        }
    }
    for path in [Path::SynNoTs, Path::EstablishedNoTs, Path::ServerNoTs] {
        items.push(item(path, Mode::Cheetah, None));
    }
    for path in [Path::Element, Path::Siphash, Path::Toeplitz] {
        items.push(item(path, Mode::Cheetah, None));
    }
    items
}
