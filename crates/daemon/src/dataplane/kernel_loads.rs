//! Folds what the XDP program's in-kernel path counted per server (`server_traffic`) into
//! the core's load totals, which the load-aware policies read at their workers' next
//! merge: traffic as a worker's `on_packet`, each connection the kernel placed as a
//! policy's pick (+1 active, +1 new connection), each count it released (a retransmitted
//! SYN's earlier pick, a counted close) as -1 active, clamped as the core clamps.

use std::collections::HashMap;

use cheetah_core::lb::LbShared;
use cheetah_core::tables::SlotState;
use cheetah_core::types::ServerId;

use super::xdp::SteeringProgram;
use super::xdp_layout::ServerTraffic;

/// The per-CPU totals grow from 0 since the program was loaded; each fold adds what they
/// grew by since the last.
#[derive(Default)]
pub struct KernelLoads {
    seen: HashMap<ServerId, ServerTraffic>,
}

impl KernelLoads {
    pub fn fold(&mut self, steering: &SteeringProgram, shared: &LbShared) -> anyhow::Result<()> {
        let snapshot = shared.snapshot.load();
        let ids: Vec<ServerId> = snapshot
            .servers
            .iter()
            .filter(|(_, slot)| slot.state != SlotState::Free)
            .map(|(id, _)| id)
            .collect();
        let totals = steering.server_traffic(&ids)?;
        for (id, total) in ids.into_iter().zip(totals) {
            let before = self.seen.insert(id, total).unwrap_or_default();
            let grew = total.wrapping_sub(before);
            if grew.packets != 0 || grew.bytes != 0 {
                shared.loads.add_traffic(id, grew.packets, grew.bytes);
            }
            if grew.opened != 0 || grew.closed != 0 {
                shared.loads.add_kernel_counts(id, grew.opened, grew.closed);
            }
        }
        Ok(())
    }
}
