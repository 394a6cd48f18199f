//! One load balancer under test: its config, control plane and workers.
//!
//! Every worker of a lab shares the lab's `LbShared` (tables, keyed hasher, timestamp MSB
//! memory), as the workers of one LB process do. That is what lets a benchmark worker route
//! the trace's established packets: the MSB of every server was learnt when the trace was
//! played through the lab's warm-up worker.

use cheetah_core::config::{Forwarding, LbConfig, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit;

/// The benchmark's fixed key: cookies in the trace must decode the same in every run.
pub const SECRET: Secret = Secret([
    0x63, 0x68, 0x65, 0x65, 0x74, 0x61, 0x68, 0x2d, 0x62, 0x65, 0x6e, 0x63, 0x68, 0x2d, 0x6b, 0x31,
]);

pub struct Lab {
    pub mode: Mode,
    pub config: LbConfig,
    pub plane: ControlPlane,
}

impl Lab {
    /// VIP 10.0.0.100:80 over `servers` servers, l2 forwarding.
    pub fn new(mode: Mode, policy: PolicyKind, servers: u16) -> anyhow::Result<Self> {
        let config = testkit::config(mode, Forwarding::L2, policy, servers);
        let plane = ControlPlane::new(&config, &SECRET).map_err(anyhow::Error::msg)?;
        Ok(Lab {
            mode,
            config,
            plane,
        })
    }

    /// A new worker (index 0 of 1) on the lab's shared state.
    pub fn worker(&self) -> Worker {
        Worker::new(
            self.plane.shared().clone(),
            WorkerConfig::new(0, 1, &self.config),
        )
    }
}
