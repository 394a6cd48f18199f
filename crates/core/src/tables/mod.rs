//! AllServers and VIPToServers as immutable snapshots, swapped atomically.
//!
//! The control plane builds a new [`Snapshot`] for every change and publishes it through a
//! [`SnapshotCell`]; workers keep an `arc_swap::Cache` of it, which costs one relaxed load
//! per packet to notice a new generation and never locks.

pub mod control;
pub mod index;
pub mod servers;
pub mod snapshot;

pub use control::{
    ControlError, ControlPlane, ControlState, Health, QuarantineRestore, SavedMember, SavedServer,
    SavedServerState, SavedVip, ServerSpec, TablesMaker,
};
pub use servers::{AllServers, ServerSlot, SlotState};
pub use snapshot::{vip_addr_bit, Snapshot, SnapshotCell, VipEntry, VipSlot};
