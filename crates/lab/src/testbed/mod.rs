//! The namespace testbed: clients, a router, the LB's namespace, a switch and nginx servers
//! on this machine, built from network namespaces and veths, for the end-to-end tests and
//! the demo (docs/testbed.md). The LB itself is not started here; `up` writes the config it
//! runs with. [`inject`] sends crafted frames from a client (docs/abuse.md). The
//! `cheetah testbed` command tree is in `crate::testbed_cli`.
//!
//! [`Topology::up`] and [`Topology::down`] are the same operations as a library; the
//! names and addresses of a testbed are in its [`Topology`] and in `<dir>/testbed.json`.

pub(crate) mod clocks;
pub mod inject;
mod lbconf;
mod lifecycle;
pub(crate) mod netns;
mod network;
mod nginx;
mod plan;
pub mod pool;
pub mod ready;
mod reboot;
mod server_clock;
pub(crate) mod shell;
pub mod status;
pub mod veth_xdp;

use std::path::PathBuf;

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::policy::PolicyKind;

pub use clocks::ServerClocks;
pub use lbconf::API_LISTEN;
pub use lifecycle::{teardown, XDP_DROPS_ON_VETHS};
pub use netns::sysctl;
pub use plan::Topology;

/// What `up` builds.
#[derive(Clone, Debug)]
pub struct Options {
    /// Namespaces are `<prefix>-lb`, `<prefix>-s1`, ...; at most 4 characters.
    pub prefix: String,
    /// LB instances (namespaces `<prefix>-lb`, `<prefix>-lb2`, ...), in the router's ECMP
    /// pool once they are ready (docs/testbed.md, "Several LB instances").
    pub lbs: u16,
    pub servers: u16,
    /// Clients behind the router, besides c0 on the LB's own segment.
    pub clients: u16,
    pub forwarding: Forwarding,
    pub mode: Mode,
    pub policy: PolicyKind,
    /// State dir; `/run/cheetah-testbed/<prefix>` if `None`.
    pub dir: Option<PathBuf>,
    pub server_clocks: ServerClocks,
    /// How many clients send no TCP timestamps (`net.ipv4.tcp_timestamps=0`, as Windows
    /// clients): the last ones, `c<n>` first.
    pub clients_without_timestamps: u16,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            prefix: "ch".into(),
            lbs: 1,
            servers: 4,
            clients: 3,
            forwarding: Forwarding::L2,
            mode: Mode::Cheetah,
            policy: PolicyKind::RoundRobin,
            dir: None,
            server_clocks: ServerClocks::Distinct,
            clients_without_timestamps: 0,
        }
    }
}
