//! AllServers: server id -> where to send, and whether the id may be used.

use crate::types::{Mac, ServerId};

/// Lifecycle of an id in AllServers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum SlotState {
    /// Never allocated, or quarantine over: cookies naming it are forged or ancient.
    #[default]
    Free,
    /// Takes new connections (when in a pool) and serves its existing ones.
    Active,
    /// No new connections; existing ones keep going.
    Draining,
    /// Retired: its connections are gone; the id is quarantined before reuse.
    Removed,
}

impl SlotState {
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Free => "free",
            SlotState::Active => "active",
            SlotState::Draining => "draining",
            SlotState::Removed => "removed",
        }
    }

    /// Whether packets of existing connections are forwarded to it.
    #[inline]
    pub fn forwards(self) -> bool {
        matches!(self, SlotState::Active | SlotState::Draining)
    }
}

/// One AllServers entry: 12 bytes, so five fit a cache line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerSlot {
    pub dip: u32,
    pub mac: Mac,
    pub state: SlotState,
    /// Whether `mac` is known (NAT servers may be reached by route instead).
    pub has_mac: bool,
}

/// What an id beyond the table is: never allocated.
static FREE_SLOT: ServerSlot = ServerSlot {
    dip: 0,
    mac: [0; 6],
    state: SlotState::Free,
    has_mac: false,
};

/// Dense table indexed by server id, sized to the largest id in use.
#[derive(Clone, Debug, Default)]
pub struct AllServers {
    slots: Box<[ServerSlot]>,
}

impl AllServers {
    pub fn from_slots(slots: Vec<ServerSlot>) -> Self {
        AllServers {
            slots: slots.into_boxed_slice(),
        }
    }

    /// The slot for `id`, read in place (a packet path loads only the fields it uses); ids
    /// past the table are `Free`.
    #[inline]
    pub fn get(&self, id: ServerId) -> &ServerSlot {
        self.slots.get(id.index()).unwrap_or(&FREE_SLOT)
    }

    pub fn iter(&self) -> impl Iterator<Item = (ServerId, &ServerSlot)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state != SlotState::Free)
            .map(|(i, s)| (ServerId(i as u16), s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_past_the_table_are_free() {
        let t = AllServers::from_slots(vec![ServerSlot {
            state: SlotState::Active,
            ..Default::default()
        }]);
        assert_eq!(t.get(ServerId(0)).state, SlotState::Active);
        assert_eq!(t.get(ServerId(1)).state, SlotState::Free);
        assert_eq!(t.get(ServerId(ServerId::MAX)).state, SlotState::Free);
        assert_eq!(t.iter().count(), 1);
        assert!(std::mem::size_of::<ServerSlot>() <= 12);
    }
}
