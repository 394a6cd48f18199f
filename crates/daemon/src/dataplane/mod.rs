//! The AF_XDP data path: an XDP program steers the LB's packets to one socket per
//! interface and queue; one worker thread per queue runs them through the core.

pub mod awrr_schedules;
pub mod egress;
pub mod host;
pub mod host_addrs;
pub mod io_counters;
pub mod kernel_loads;
pub mod maglev_tables;
pub mod map_memory;
pub mod meta;
pub mod neighbour;
pub mod next_hops;
pub mod pin;
pub mod publish_window;
pub mod reply_senders;
pub mod route_netlink;
#[cfg(test)]
mod shared_layout_tests;
pub mod sides;
pub mod vip_slots;
pub mod worker_loop;
pub mod xdp;
pub mod xdp_layout;
pub mod xdp_policy;
pub mod xdp_tables;
pub mod xsk;

use anyhow::{bail, Context};
use cheetah_core::types::parse_mac;

pub use io_counters::IoCounters;
pub use xsk::Interface;

impl Interface {
    /// Looks up a network interface of this namespace by name.
    pub fn discover(name: &str, slot: u32) -> anyhow::Result<Self> {
        let cname = std::ffi::CString::new(name).context("interface name contains NUL")?;
        // SAFETY: a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            bail!("interface {name} does not exist in this network namespace");
        }
        let sys = format!("/sys/class/net/{name}");
        let address = std::fs::read_to_string(format!("{sys}/address"))
            .with_context(|| format!("interface {name}: cannot read its MAC"))?;
        let mac = parse_mac(address.trim())
            .with_context(|| format!("interface {name}: not an Ethernet interface"))?;
        let queues = std::fs::read_dir(format!("{sys}/queues"))
            .with_context(|| format!("interface {name}: cannot list its queues"))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
            .count() as u32;
        Ok(Interface {
            name: name.to_string(),
            ifindex,
            mac,
            slot,
            queues: queues.max(1),
        })
    }
}
