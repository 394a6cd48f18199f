//! The test thread alone in a network namespace laid out as an LB host: `lo` up with IPv4
//! forwarding (what `cheetah run` sets for the FIB lookups), the servers' subnet behind one
//! veth, the clients behind a gateway with a static neighbour entry on another, and the
//! default route through that gateway. Included by path (`#[path]`) with `ip_command.rs`.

use cheetah_core::types::Mac;
use cheetah_daemon::dataplane::Interface;

use super::ip_command::ip;

/// The clients' gateway, on the clients' veth.
pub const GATEWAY: &str = "10.7.0.2";

/// One veth pair the namespace makes: the LB's end (its name and MAC) and its peer's name.
pub struct Veth {
    pub name: &'static str,
    pub mac: Mac,
    pub peer: &'static str,
}

pub fn mac_text(mac: &Mac) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

/// Points the clients' gateway at `mac` (a static neighbour entry on `clients`).
pub fn set_gateway_mac(clients: &str, mac: &Mac) {
    ip(&[
        "neigh",
        "replace",
        GATEWAY,
        "lladdr",
        &mac_text(mac),
        "nud",
        "permanent",
        "dev",
        clients,
    ]);
}

/// Moves this thread, alone, to a new namespace laid out as the module says: the servers'
/// 10.1.0.0/16 behind `servers`, the clients through [`GATEWAY`] (at `gateway_mac`) behind
/// `clients`.
pub fn enter_lb_namespace(servers: &Veth, clients: &Veth, gateway_mac: &Mac) {
    // SAFETY: unshare only changes this thread's namespaces.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    ip(&["link", "set", "lo", "up"]);
    std::fs::write("/proc/sys/net/ipv4/conf/lo/forwarding", "1").unwrap();
    for veth in [servers, clients] {
        ip(&[
            "link",
            "add",
            veth.name,
            "address",
            &mac_text(&veth.mac),
            "type",
            "veth",
            "peer",
            "name",
            veth.peer,
        ]);
        ip(&["link", "set", veth.name, "up"]);
        ip(&["link", "set", veth.peer, "up"]);
    }
    ip(&["addr", "add", "10.1.255.254/16", "dev", servers.name]);
    ip(&["addr", "add", "10.7.0.1/24", "dev", clients.name]);
    set_gateway_mac(clients.name, gateway_mac);
    ip(&[
        "route",
        "add",
        "default",
        "via",
        GATEWAY,
        "dev",
        clients.name,
    ]);
}

/// `veth` as the data path sees an interface, in `slot` (sysfs shows the host's interfaces,
/// not this thread's namespace's, so the MAC is the one the namespace was made with).
pub fn interface(veth: &Veth, slot: u32) -> Interface {
    let cname = std::ffi::CString::new(veth.name).unwrap();
    // SAFETY: a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    assert_ne!(
        ifindex,
        0,
        "interface {}: {}",
        veth.name,
        std::io::Error::last_os_error()
    );
    Interface {
        name: veth.name.to_string(),
        ifindex,
        mac: veth.mac,
        slot,
        queues: 1,
    }
}
