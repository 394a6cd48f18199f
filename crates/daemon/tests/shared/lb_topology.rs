//! The LB host the XDP tests hold the program to the core in: the test thread's own
//! namespace (`lb_namespace.rs`) with the servers' veth and the clients' veth, whose
//! ifindexes and MACs the kernel and the worker's egress step both use (included by path,
//! `#[path]`, with `lb_namespace.rs` and `ip_command.rs`).

// Not every test binary that includes this file sends from both sides.
#![allow(dead_code)]

use cheetah_core::lb::Ingress;
use cheetah_core::types::Mac;
use cheetah_daemon::dataplane::Interface;

use super::lb_namespace::{enter_lb_namespace, interface, Veth};

/// The client gateway's MAC: what the FIB answers for every client address.
pub const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x01];

#[derive(Clone, Copy, Debug)]
pub struct Port {
    pub ifindex: u32,
    pub mac: Mac,
}

/// The LB's two interfaces in the test's namespace.
pub struct Topology {
    /// Faces the servers (10.1.0.0/16): published as `Ingress::ServerSide`.
    pub servers: Port,
    /// Faces the clients: the default route, through a gateway with a static neighbour
    /// entry; published as `Ingress::ClientSide`.
    pub clients: Port,
}

impl Topology {
    /// The interface a packet arrives on for the core's `ingress`.
    pub fn port(&self, ingress: Ingress) -> Port {
        match ingress {
            Ingress::ServerSide => self.servers,
            Ingress::ClientSide => self.clients,
        }
    }

    /// The interfaces as the publisher and `cheetah run` see them, with their sides.
    pub fn interfaces(&self) -> ([Interface; 2], [Ingress; 2]) {
        (
            [interface(&SERVERS, 0), interface(&CLIENTS, 1)],
            [Ingress::ServerSide, Ingress::ClientSide],
        )
    }
}

/// The interfaces' MACs are set when they are made: sysfs (`Interface::discover`) shows the
/// namespace it was mounted in, not this thread's.
const SERVERS: Veth = Veth {
    name: "xp-srv",
    mac: [0x02, 0x1b, 0x00, 0x00, 0x00, 0x05],
    peer: "xp-srv-p",
};
const CLIENTS: Veth = Veth {
    name: "xp-cli",
    mac: [0x02, 0x1b, 0x00, 0x00, 0x00, 0x0c],
    peer: "xp-cli-p",
};

fn port(veth: &Veth) -> Port {
    Port {
        ifindex: interface(veth, 0).ifindex,
        mac: veth.mac,
    }
}

/// Moves this thread, alone, to a new network namespace laid out as an LB host
/// (`enter_lb_namespace`): the servers' subnet behind one veth, the clients behind a
/// gateway on the other.
pub fn enter_new_namespace() -> Topology {
    enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
    Topology {
        servers: port(&SERVERS),
        clients: port(&CLIENTS),
    }
}
