//! A small immutable hash index for the per-packet lookups of a snapshot (VIP by address and
//! port, server by MAC, NAT backend by DIP and port).
//!
//! Why hand-written: these maps are built once per snapshot and read for every packet.
//! A general hash map (hashbrown with FxHash) spends its instructions on SIMD group probing,
//! tombstones and growth that an immutable table of a few keys never needs. Here a lookup is
//! one multiply, a shift and, almost always, one compare: keys sit in a power-of-two table at
//! most a quarter full (and of at least [`MIN_SLOTS`] slots, so that a table of one VIP sends
//! few misses to a second probe), with linear probing. The benchmark measured the two map
//! lookups of a client packet at about 85 instructions with hashbrown.

/// Fewest slots an index has. A server's reply is told from a client's packet by a miss in
/// the VIP index; with one VIP in 8 slots, one miss in 8 met the VIP's slot and probed on.
pub const MIN_SLOTS: usize = 32;

/// Immutable open-addressing map from a non-zero-extended u64 key to a small `Copy` value.
#[derive(Clone, Debug)]
pub struct FlatIndex<V: Copy> {
    /// `(key + 1, value)`; a stored key of 0 marks an empty slot, so every u64 but
    /// `u64::MAX` can be a key.
    slots: Box<[(u64, V)]>,
    shift: u32,
}

impl<V: Copy + Default> FlatIndex<V> {
    /// Builds the index; later duplicates of a key replace earlier ones.
    pub fn build(entries: impl IntoIterator<Item = (u64, V)>) -> Self {
        Self::build_with_filler(entries, V::default())
    }
}

impl<V: Copy> FlatIndex<V> {
    /// [`build`](FlatIndex::build) for values without a `Default`: `filler` sits in the
    /// empty slots, where no lookup ever returns it.
    pub fn build_with_filler(entries: impl IntoIterator<Item = (u64, V)>, filler: V) -> Self {
        let entries: Vec<(u64, V)> = entries.into_iter().collect();
        let capacity = (entries.len() * 4).next_power_of_two().max(MIN_SLOTS);
        let shift = 64 - capacity.trailing_zeros();
        let mut index = FlatIndex {
            slots: vec![(0, filler); capacity].into_boxed_slice(),
            shift,
        };
        for (key, value) in entries {
            assert_ne!(key, u64::MAX, "u64::MAX cannot be a key");
            let mut at = index.home(key);
            loop {
                let slot = &mut index.slots[at];
                if slot.0 == 0 || slot.0 == key + 1 {
                    *slot = (key + 1, value);
                    break;
                }
                at = (at + 1) & (capacity - 1);
            }
        }
        index
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The value stored for `key`.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<V> {
        self.find(key).copied()
    }

    /// [`get`](FlatIndex::get) by reference. The value lies in the slot the key was found
    /// in, so reading it waits for nothing but the slot's address, whereas a value that is
    /// an index into another table must be loaded before that table can be.
    ///
    /// The home slot is inline (a hit, or an empty slot: a miss), the rest of the probe
    /// sequence out of line, so that the per-packet paths stay straight.
    #[inline(always)]
    pub fn find(&self, key: u64) -> Option<&V> {
        let stored = key.wrapping_add(1);
        let at = self.home(key);
        let slot = &self.slots[at];
        if slot.0 == stored {
            return Some(&slot.1);
        }
        if slot.0 == 0 {
            return None;
        }
        self.probe(at, stored)
    }

    /// Linear probing from the slot after `at`.
    #[inline(never)]
    fn probe(&self, mut at: usize, stored: u64) -> Option<&V> {
        let mask = self.slots.len() - 1;
        loop {
            at = (at + 1) & mask;
            let slot = &self.slots[at];
            if slot.0 == stored {
                return Some(&slot.1);
            }
            if slot.0 == 0 {
                return None;
            }
        }
    }

    #[inline]
    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn empty_index_finds_nothing() {
        let index: FlatIndex<u16> = FlatIndex::build([]);
        assert_eq!(index.get(0), None);
        assert_eq!(index.get(12345), None);
    }

    #[test]
    fn zero_is_a_valid_key_and_later_duplicates_win() {
        let index = FlatIndex::build([(0, 1u16), (7, 2), (0, 3)]);
        assert_eq!(index.get(0), Some(3));
        assert_eq!(index.get(7), Some(2));
        assert_eq!(index.get(8), None);
    }

    proptest! {
        #[test]
        fn agrees_with_a_hash_map(keys in proptest::collection::vec(0u64..u64::MAX, 0..300), probes in proptest::collection::vec(any::<u64>(), 50)) {
            let reference: HashMap<u64, u32> = keys.iter().enumerate().map(|(i, k)| (*k, i as u32)).collect();
            let index = FlatIndex::build(keys.iter().enumerate().map(|(i, k)| (*k, i as u32)));
            for k in keys.iter().chain(probes.iter().filter(|p| **p != u64::MAX)) {
                prop_assert_eq!(index.get(*k), reference.get(k).copied());
            }
        }
    }
}
