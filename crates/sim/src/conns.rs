//! The active connections of one run: a slab with stable slot numbers, so departure
//! events and load-balancer models can name a connection by slot without any per-event
//! allocation, and a full pass over the active set is a linear scan of one array.

use cheetah_core::{Nanos, ServerId};

/// One active connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Conn {
    pub flow_hash: u64,
    /// Free for the load-balancer model: a bucket index, a choice index, a bit set of the
    /// LB instances holding state for the connection.
    pub aux: u64,
    pub start: Nanos,
    pub bytes: u64,
    /// The server the connection was placed on; it never changes (a connection whose
    /// packets would go elsewhere is broken and ends).
    pub server: ServerId,
    /// The client sends TCP timestamps (cheetah can place a cookie).
    pub timestamps: bool,
    alive: bool,
    /// Bumped when the slot is freed, so stale departure events are recognised.
    generation: u32,
}

impl Conn {
    /// A connection not placed yet (no server, no model state).
    pub fn new(flow_hash: u64, bytes: u64, timestamps: bool, start: Nanos) -> Self {
        Conn {
            flow_hash,
            bytes,
            timestamps,
            start,
            ..Conn::default()
        }
    }

    pub fn generation(&self) -> u32 {
        self.generation
    }
}

/// Slab of active connections.
#[derive(Default)]
pub struct ConnTable {
    slots: Vec<Conn>,
    free: Vec<u32>,
    active: usize,
}

impl ConnTable {
    pub fn with_capacity(capacity: usize) -> Self {
        ConnTable {
            slots: Vec::with_capacity(capacity),
            free: Vec::with_capacity(capacity / 8),
            active: 0,
        }
    }

    /// Stores `conn` and returns its slot.
    pub fn insert(&mut self, mut conn: Conn) -> u32 {
        conn.alive = true;
        self.active += 1;
        if let Some(slot) = self.free.pop() {
            conn.generation = self.slots[slot as usize].generation;
            self.slots[slot as usize] = conn;
            slot
        } else {
            conn.generation = 0;
            self.slots.push(conn);
            (self.slots.len() - 1) as u32
        }
    }

    /// Frees `slot`; returns the connection it held.
    pub fn remove(&mut self, slot: u32) -> Conn {
        let conn = &mut self.slots[slot as usize];
        debug_assert!(conn.alive, "slot {slot} freed twice");
        let removed = *conn;
        conn.alive = false;
        conn.generation = conn.generation.wrapping_add(1);
        self.free.push(slot);
        self.active -= 1;
        removed
    }

    /// The connection in `slot` if it is still the one of `generation`.
    #[inline]
    pub fn get_live(&self, slot: u32, generation: u32) -> Option<&Conn> {
        self.slots
            .get(slot as usize)
            .filter(|conn| conn.alive && conn.generation == generation)
    }

    #[inline]
    pub fn get(&self, slot: u32) -> &Conn {
        &self.slots[slot as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> &mut Conn {
        &mut self.slots[slot as usize]
    }

    pub fn is_alive(&self, slot: u32) -> bool {
        self.slots.get(slot as usize).is_some_and(|conn| conn.alive)
    }

    pub fn len(&self) -> usize {
        self.active
    }

    pub fn is_empty(&self) -> bool {
        self.active == 0
    }

    /// Every active connection with its slot, in slot order (deterministic).
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Conn)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, conn)| conn.alive)
            .map(|(slot, conn)| (slot as u32, conn))
    }

    /// Like [`ConnTable::iter`], mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Conn)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter(|(_, conn)| conn.alive)
            .map(|(slot, conn)| (slot as u32, conn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_with_a_new_generation() {
        let mut table = ConnTable::default();
        let a = table.insert(Conn::default());
        let b = table.insert(Conn::default());
        let generation = table.get(a).generation();
        table.remove(a);
        assert!(table.get_live(a, generation).is_none());
        let c = table.insert(Conn::default());
        assert_eq!(c, a);
        assert_ne!(table.get(c).generation(), generation);
        assert_eq!(table.len(), 2);
        assert_eq!(
            table.iter().map(|(slot, _)| slot).collect::<Vec<_>>(),
            [a, b]
        );
    }
}
