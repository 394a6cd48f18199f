//! AllServers: server id -> where to send, and whether the id may be used.

use crate::config::ConfiguredState;
use crate::types::{boxed_array, Mac, ServerId};

/// Lifecycle of an id in AllServers.
///
/// The two states that forward come last, so that [`SlotState::forwards`], which every
/// client packet asks, is one compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum SlotState {
    /// Never allocated, or quarantine over: cookies naming it are forged or ancient.
    #[default]
    Free = 0,
    /// Retired: its connections are gone; the id is quarantined before reuse.
    Removed = 1,
    /// Takes new connections (when in a pool) and serves its existing ones.
    Active = 2,
    /// No new connections; existing ones keep going.
    Draining = 3,
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
    #[inline(always)]
    pub fn forwards(self) -> bool {
        self as u8 >= SlotState::Active as u8
    }
}

/// A server configured, or added at run time, in one of the states it may start in.
impl From<ConfiguredState> for SlotState {
    fn from(state: ConfiguredState) -> Self {
        match state {
            ConfiguredState::Active => SlotState::Active,
            ConfiguredState::Draining => SlotState::Draining,
        }
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

/// What an id beyond the id space is: never allocated.
static FREE_SLOT: ServerSlot = ServerSlot {
    dip: 0,
    mac: [0; 6],
    state: SlotState::Free,
    has_mac: false,
};

/// Dense table indexed by server id, with a slot for every id a cookie can name (384 KiB;
/// a packet touches only its server's), so that an id decoded from a cookie, which has 15
/// bits, is looked up without a bounds check.
#[derive(Clone, Debug)]
pub struct AllServers {
    slots: Box<[ServerSlot; ServerId::SPACE]>,
    /// Slots from here on are `Free`: what [`AllServers::iter`] scans, so that building a
    /// snapshot costs the ids in use, not the id space.
    in_use: usize,
}

impl Default for AllServers {
    fn default() -> Self {
        AllServers::from_slots(Vec::new())
    }
}

impl AllServers {
    /// `slots[i]` is id `i`'s slot; the ids after them are `Free`.
    ///
    /// # Panics
    /// With more slots than ids (the control plane allocates ids in `0..=ServerId::MAX`).
    pub fn from_slots(slots: Vec<ServerSlot>) -> Self {
        assert!(slots.len() <= ServerId::SPACE, "more slots than server ids");
        let mut all: Box<[ServerSlot; ServerId::SPACE]> = boxed_array(ServerSlot::default());
        all[..slots.len()].copy_from_slice(&slots);
        AllServers {
            slots: all,
            in_use: slots.len(),
        }
    }

    /// The slot for `id`, read in place (a packet path loads only the fields it uses). The
    /// check is for ids built by hand: the compiler drops it for an id masked to 15 bits.
    #[inline(always)]
    pub fn get(&self, id: ServerId) -> &ServerSlot {
        self.slots.get(id.index()).unwrap_or(&FREE_SLOT)
    }

    pub fn iter(&self) -> impl Iterator<Item = (ServerId, &ServerSlot)> {
        self.slots[..self.in_use]
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
        assert_eq!(t.get(ServerId(u16::MAX)).state, SlotState::Free);
        assert_eq!(t.iter().count(), 1);
        assert!(std::mem::size_of::<ServerSlot>() <= 12);
    }

    #[test]
    fn only_active_and_draining_forward() {
        let forwarding: Vec<SlotState> = [
            SlotState::Free,
            SlotState::Removed,
            SlotState::Active,
            SlotState::Draining,
        ]
        .into_iter()
        .filter(|s| s.forwards())
        .collect();
        assert_eq!(forwarding, [SlotState::Active, SlotState::Draining]);
    }
}
