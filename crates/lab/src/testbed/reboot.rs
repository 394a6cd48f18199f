//! `cheetah testbed reboot`: what a server's reboot shows the LB, without a VM. Every
//! process in the server's namespace ends (SIGTERM, then SIGKILL), its TCP timestamp clock
//! restarts near 0 (the tc program of `server_clock.rs`, attached again with a new offset:
//! a rebooted Linux host's TSvals count from its boot), and nginx starts again.
//!
//! The LB must notice the new clock by itself: its estimate of the server's clock is far
//! ahead of the new one, and a restore from it would hand the server TSecr values it never
//! sent, which Linux >= 6.15 rejects (`TSEcrRejected`).

use anyhow::Context;

use super::clocks::{monotonic_ms, tsval_at};
use super::plan::Topology;
use super::{netns, nginx, server_clock};

impl Topology {
    /// Reboots server `name` (`s2`): its processes end, its clock restarts at
    /// `uptime_ms` and nginx starts again; the new clock offset is written to the summary.
    /// Returns the TSval its clock showed just before and just after.
    pub fn reboot_server(&mut self, name: &str, uptime_ms: u32) -> anyhow::Result<(u32, u32)> {
        let index = self
            .servers
            .iter()
            .position(|s| s.name == name)
            .with_context(|| format!("testbed `{}` has no server {name}", self.prefix))?;
        let server = self.servers[index].clone();
        let before = tsval_at(monotonic_ms(), server.clock_offset);
        netns::kill_processes(std::slice::from_ref(&server.namespace))
            .with_context(|| format!("cannot stop what runs on {name}"))?;
        let offset = uptime_ms.wrapping_sub(monotonic_ms() as u32);
        server_clock::attach(&server.namespace, &server.link.interface, offset)
            .with_context(|| format!("cannot restart {name}'s clock"))?;
        self.servers[index].clock_offset = offset;
        nginx::start(&server, &self.files.www)?;
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(&self.files.summary, json + "\n")
            .with_context(|| format!("cannot write {}", self.files.summary.display()))?;
        Ok((before, tsval_at(monotonic_ms(), offset)))
    }
}
