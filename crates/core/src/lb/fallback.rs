//! The fallback table: flow → server for connections the cookie cannot route, one table
//! shared by every worker of the LB process.
//!
//! Normally the server a connection was sent to is carried statelessly in the TCP timestamp
//! echo (the "cookie"). Clients that send no TCP timestamp option (Windows, mostly), and
//! servers that decline the option, leave nothing to carry it in, so for those flows alone
//! the LB remembers the choice here. The same goes for a client segment without ACK other
//! than a SYN (a RST, mostly): its TSecr echoes nothing (RFC 7323), so it is looked up here
//! too.
//!
//! # Why one table for all workers
//!
//! A connection's packets do not all reach the same worker. Its SYN-ACK comes in on the
//! servers' interface, on the queue that interface's RSS hash picks (in NAT mode from the
//! server's address, so even a symmetric hash cannot put it with the client's packets),
//! and a client's packets can move to another queue mid-connection (Linux draws a new
//! transmit hash after a retransmission timeout; an operator re-spreads RSS). A per-worker
//! table only knew what its own worker had seen, so the worker that got the client's
//! packets often asked Maglev instead, which may name another server (always, when the
//! policy placed the SYN and the server then declined timestamps).
//!
//! # Layout
//!
//! A set-associative cache of `AtomicU64` words, allocated once
//! ([`FallbackTable::with_capacity`]) and never again:
//!
//! * sets of [`WAYS`] = 8 words, one 64-byte cache line each (the set type is aligned to
//!   64), so a lookup reads exactly one line;
//! * the set is the flow hash's low bits (`hash & (sets - 1)`); the pipeline has already
//!   computed the keyed SipHash of the connection, and an attacker who cannot predict it
//!   cannot aim flows at one set;
//! * a word packs `valid:1 | reserved:1 | server:14 | time:16 | tag:32`, where the tag is
//!   the hash's high 32 bits (independent of the set bits, which are at most 27) and the
//!   time is the last use in units of 2^30 ns (1.07 s), wrapping every 19.5 h.
//!
//! Operations, all without locks (relaxed atomics: a word is self-contained, nothing else
//! is published through it):
//!
//! * **lookup** scans the set for the first valid word with the flow's tag and returns its
//!   server; it refreshes the word's time only when the time unit changed, so a busy flow
//!   writes its shared line about once a second rather than every packet;
//! * **insert** updates the first word with the flow's tag, else takes an empty way, else
//!   replaces the way used least recently (oldest time; an eviction), each by a
//!   compare-and-swap from the value it read, retried a few times under contention;
//! * **remove** swaps the flow's words back to 0 (only if unchanged since read).
//!
//! # What races and collisions can do
//!
//! Workers race only on the same set. A lost race can lose an entry (a compare-and-swap that
//! keeps failing gives up after [`INSERT_ATTEMPTS`]; another worker's insert evicts it), or
//! leave the same tag in two ways (two inserts of one flow that both found no match; the
//! first way is the one every later lookup and update use, the shadow ages out). A lost entry
//! means the flow's packets fall back to Maglev, exactly as when an entry is evicted. No race
//! returns a server for another flow: every word is written whole, and read whole.
//!
//! A wrong answer takes a tag collision: a flow that is not in the table is found if one of
//! the (at most 8) valid words of its set has its 32-bit tag, probability at most
//! 8 / 2^32 ≈ 1.9·10^-9 per lookup; an insert likewise overwrites another flow's entry with
//! at most that probability (so at 100 000 new no-timestamp connections a second with the
//! table full, about one connection every 1.5 h is sent to another flow's server). The
//! flow must then also have the same set bits, which the keyed hash makes unforgeable.
//!
//! # Capacity and eviction
//!
//! `fallback_table_capacity` entries, rounded up to a power of two and at least one set (8
//! entries): `capacity * 8` bytes (8 MiB by default). Eviction is per set: a set holds 8
//! flows, so with `n` live flows in the table some sets overflow before the table is full
//! (with `n` at half the capacity, about 2% of sets would hold a ninth flow): size it to at
//! least twice the connections without timestamps expected to be open at once. A flow idle
//! for longer than the time field wraps (19.5 h) may look recent to the eviction; that only
//! changes which of the set's flows goes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::types::{Nanos, ServerId};
use crate::words::Words;

/// Default number of flows the table holds (8 MiB).
pub const DEFAULT_CAPACITY: usize = 1 << 20;

/// Largest accepted capacity (8 GiB of words).
pub const MAX_CAPACITY: usize = 1 << 30;

/// Words per set: one 64-byte cache line.
pub const WAYS: usize = 8;

/// How many times an insert reads its set again after losing a compare-and-swap to
/// another worker before it gives the entry up.
pub const INSERT_ATTEMPTS: usize = 4;

/// The time field counts units of 2^30 ns (1.07 s).
const TIME_UNIT_SHIFT: u32 = 30;

const TAG_MASK: u64 = 0xffff_ffff;
const TIME_SHIFT: u32 = 32;
const TIME_MASK: u64 = 0xffff << TIME_SHIFT;
const SERVER_SHIFT: u32 = 48;
const SERVER_MASK: u64 = ServerId::MAX as u64;
const VALID: u64 = 1 << 63;

/// One set: a cache line of words. The XDP program's `fallback` map holds the same sets
/// (`struct fallback_set`, bpf/include/cheetah_shared.h), one per entry.
#[repr(C, align(64))]
struct Set([AtomicU64; WAYS]);

/// Bytes of a set: a word array handed to [`FallbackTable::with_words`] must be aligned to it.
pub const SET_BYTES: usize = std::mem::size_of::<Set>();

impl Set {
    fn empty() -> Self {
        Set(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// What [`FallbackTable::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insert {
    /// The flow took an empty way.
    Added,
    /// The flow was there: its server and time are set (or were already).
    Updated,
    /// The flow took the way of the set's least recently used flow, which is forgotten.
    Evicted,
    /// Other workers kept changing the set: the entry was not written.
    Lost,
}

/// A remembered flow, as [`FallbackTable::export`] gives it for the next LB process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedFlow {
    /// The set it is in: its hash's low bits.
    pub set: u32,
    /// Its hash's high 32 bits.
    pub tag: u32,
    pub server: ServerId,
    /// Time since its last use, in units of 2^30 ns (1.07 s).
    pub idle_units: u16,
}

/// The flow hash's part that is kept in a word.
#[inline(always)]
fn tag(hash: u64) -> u64 {
    hash >> 32
}

#[inline(always)]
fn unit(now: Nanos) -> u64 {
    (now >> TIME_UNIT_SHIFT) & 0xffff
}

#[inline(always)]
fn pack(tag: u64, server: ServerId, unit: u64) -> u64 {
    debug_assert!(server.0 <= ServerId::MAX);
    VALID | ((server.0 as u64 & SERVER_MASK) << SERVER_SHIFT) | (unit << TIME_SHIFT) | tag
}

#[inline(always)]
fn holds(word: u64, tag: u64) -> bool {
    word & VALID != 0 && word & TAG_MASK == tag
}

#[inline(always)]
fn server_of(word: u64) -> ServerId {
    ServerId(((word >> SERVER_SHIFT) & SERVER_MASK) as u16)
}

#[inline(always)]
fn unit_of(word: u64) -> u64 {
    (word & TIME_MASK) >> TIME_SHIFT
}

/// Flow → server for connections without a usable cookie, shared by all workers; see the
/// module docs. Every method takes `&self`.
///
/// The caller passes the keyed flow hash of the connection (the same hash for the same
/// connection every time); `now` is the pipeline's clock.
pub struct FallbackTable {
    sets: Words<Set>,
    /// `sets.len() - 1`; the set count is a power of two.
    mask: usize,
}

impl Default for FallbackTable {
    /// A table of [`DEFAULT_CAPACITY`] flows.
    fn default() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }
}

impl FallbackTable {
    /// The number of flows a table asked for `capacity` holds: `capacity` rounded up to a
    /// power of two, at least one set ([`WAYS`]).
    pub fn rounded_capacity(capacity: usize) -> usize {
        capacity.max(WAYS).next_power_of_two()
    }

    /// Allocates a table for [`rounded_capacity`](Self::rounded_capacity)`(capacity)` flows.
    /// This is the only allocation the table ever makes.
    ///
    /// # Panics
    /// If `capacity` is 0 or above [`MAX_CAPACITY`]; both are configuration errors.
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(
            (1..=MAX_CAPACITY).contains(&capacity),
            "fallback table capacity must be in 1..={MAX_CAPACITY}, got {capacity}"
        );
        let sets = Self::rounded_capacity(capacity) / WAYS;
        FallbackTable {
            sets: Words::owned((0..sets).map(|_| Set::empty()).collect()),
            mask: sets - 1,
        }
    }

    /// A table over the caller's words, which live as long as the process: the XDP
    /// program's mmapped `fallback` array, so that the kernel looks flows up in the table
    /// the workers fill. The words are cleared: a table starts knowing no flow.
    ///
    /// # Panics
    /// Unless `words.len()` is a power of two of at least [`WAYS`] and at most
    /// [`MAX_CAPACITY`], and the words start on a [`SET_BYTES`] boundary (a mapping does).
    pub fn with_words(words: &'static [AtomicU64]) -> Self {
        let table = Self::with_kept_words(words);
        table.clear();
        table
    }

    /// [`with_words`](Self::with_words) knowing the flows the words hold: words an
    /// earlier process filled (a pinned map). Their times are the core's clock's, which
    /// must continue.
    ///
    /// # Panics
    /// As [`with_words`](Self::with_words).
    pub fn with_kept_words(words: &'static [AtomicU64]) -> Self {
        assert!(
            words.len().is_power_of_two() && (WAYS..=MAX_CAPACITY).contains(&words.len()),
            "a fallback table has a power of two of words in {WAYS}..={MAX_CAPACITY}, not {}",
            words.len()
        );
        assert!(
            (words.as_ptr() as usize).is_multiple_of(SET_BYTES),
            "fallback table words must be {SET_BYTES}-byte aligned"
        );
        let sets = words.len() / WAYS;
        // SAFETY: `Set` is `repr(C)` over `[AtomicU64; WAYS]`, so `sets` sets are exactly
        // the `words.len()` words, which are aligned for it (checked above) and `'static`.
        let sets_view: &'static [Set] =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<Set>(), sets) };
        FallbackTable {
            sets: Words::borrowed(sets_view),
            mask: sets - 1,
        }
    }

    /// Number of flows the table holds before it starts evicting (at most; see the module
    /// docs on sets).
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    #[inline(always)]
    fn set(&self, hash: u64) -> &Set {
        &self.sets[hash as usize & self.mask]
    }

    /// The server remembered for the flow, marking it used at `now`.
    #[inline]
    pub fn lookup(&self, hash: u64, now: Nanos) -> Option<ServerId> {
        let tag = tag(hash);
        let unit = unit(now);
        for way in &self.set(hash).0 {
            let word = way.load(Relaxed);
            if holds(word, tag) {
                if unit_of(word) != unit {
                    // Lost to another worker's write: that one is as recent.
                    let _ = way.compare_exchange(
                        word,
                        (word & !TIME_MASK) | (unit << TIME_SHIFT),
                        Relaxed,
                        Relaxed,
                    );
                }
                return Some(server_of(word));
            }
        }
        None
    }

    /// The server remembered for the flow, without marking it used (ICMP errors, which say
    /// nothing about whether the connection is alive; diagnostics and tests).
    #[inline]
    pub fn peek(&self, hash: u64) -> Option<ServerId> {
        let tag = tag(hash);
        self.set(hash)
            .0
            .iter()
            .map(|way| way.load(Relaxed))
            .find(|word| holds(*word, tag))
            .map(server_of)
    }

    /// Remembers `server` for the flow, used at `now`; see the module docs for which way it
    /// takes.
    #[inline]
    pub fn insert(&self, hash: u64, server: ServerId, now: Nanos) -> Insert {
        self.insert_word(&self.set(hash).0, pack(tag(hash), server, unit(now)))
    }

    /// Puts `new` (a valid word) into `set`: over the word with its tag, else into an
    /// empty way, else over the least recently used.
    #[inline]
    fn insert_word(&self, set: &[AtomicU64; WAYS], new: u64) -> Insert {
        let tag = new & TAG_MASK;
        let unit = unit_of(new);
        'attempt: for _ in 0..INSERT_ATTEMPTS {
            let mut empty = None;
            // (way, word, age in time units)
            let mut oldest: Option<(usize, u64, u64)> = None;
            for (i, way) in set.iter().enumerate() {
                let word = way.load(Relaxed);
                if word & VALID == 0 {
                    empty = empty.or(Some(i));
                    continue;
                }
                if word & TAG_MASK == tag {
                    if word == new {
                        return Insert::Updated;
                    }
                    match way.compare_exchange(word, new, Relaxed, Relaxed) {
                        Ok(_) => return Insert::Updated,
                        Err(_) => continue 'attempt,
                    }
                }
                let age = unit.wrapping_sub(unit_of(word)) & 0xffff;
                if oldest.is_none_or(|(_, _, a)| age > a) {
                    oldest = Some((i, word, age));
                }
            }
            let (i, expected, outcome) = match (empty, oldest) {
                (Some(i), _) => (i, 0, Insert::Added),
                (None, Some((i, word, _))) => (i, word, Insert::Evicted),
                (None, None) => unreachable!("a full set has a valid way"),
            };
            if set[i]
                .compare_exchange(expected, new, Relaxed, Relaxed)
                .is_ok()
            {
                return outcome;
            }
        }
        Insert::Lost
    }

    /// Forgets the flow, returning the server it had.
    #[inline]
    pub fn remove(&self, hash: u64) -> Option<ServerId> {
        let tag = tag(hash);
        let mut removed = None;
        for way in &self.set(hash).0 {
            let word = way.load(Relaxed);
            if holds(word, tag) && way.compare_exchange(word, 0, Relaxed, Relaxed).is_ok() {
                removed = removed.or(Some(server_of(word)));
            }
        }
        removed
    }

    /// Every flow remembered, for a restart of the LB process to take over
    /// ([`import`](Self::import)). Reads the whole table; not for the packet path.
    pub fn export(&self, now: Nanos) -> Vec<SavedFlow> {
        let unit = unit(now);
        let mut flows = Vec::new();
        for (index, set) in self.sets.iter().enumerate() {
            for way in &set.0 {
                let word = way.load(Relaxed);
                if word & VALID != 0 {
                    flows.push(SavedFlow {
                        set: index as u32,
                        tag: (word & TAG_MASK) as u32,
                        server: server_of(word),
                        idle_units: (unit.wrapping_sub(unit_of(word)) & 0xffff) as u16,
                    });
                }
            }
        }
        flows
    }

    /// Remembers `flows`, exported from a table of `saved_sets` sets (its
    /// [`sets`](Self::sets)) keyed by the same secret, each used `idle_units` (plus
    /// `extra_idle_units`, the time in between, saturating) before `now`. Returns how many
    /// went in. A flow's set is its hash's low bits, so a table with as many sets or fewer
    /// can place every flow; a bigger one cannot tell which of its sets a flow belongs to,
    /// and takes none.
    pub fn import(
        &self,
        saved_sets: usize,
        flows: &[SavedFlow],
        extra_idle_units: u64,
        now: Nanos,
    ) -> usize {
        if saved_sets < self.sets.len() {
            return 0;
        }
        let unit = unit(now);
        let mut imported = 0;
        for flow in flows {
            if flow.server.0 > ServerId::MAX || flow.set as usize >= saved_sets {
                continue;
            }
            let idle = (u64::from(flow.idle_units) + extra_idle_units).min(0xffff);
            let used = unit.wrapping_sub(idle) & 0xffff;
            let set = &self.sets[flow.set as usize & self.mask].0;
            match self.insert_word(set, pack(u64::from(flow.tag), flow.server, used)) {
                Insert::Added | Insert::Updated | Insert::Evicted => imported += 1,
                Insert::Lost => {}
            }
        }
        imported
    }

    /// Number of sets (a power of two): a flow's set is its hash's low bits.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// Forgets every flow (tests and the fuzz harness reuse one table across runs).
    pub fn clear(&self) {
        for set in self.sets.iter() {
            for way in &set.0 {
                way.store(0, Relaxed);
            }
        }
    }

    /// Number of flows remembered: a scan of the whole table, for diagnostics and tests.
    pub fn len(&self) -> usize {
        self.sets
            .iter()
            .flat_map(|set| &set.0)
            .filter(|way| way.load(Relaxed) & VALID != 0)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::NANOS_PER_SEC;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// Time unit `n`.
    fn at(n: u64) -> Nanos {
        n << TIME_UNIT_SHIFT
    }

    /// A hash in set `set` with tag `tag`.
    fn hash(set: u64, tag: u32) -> u64 {
        (u64::from(tag) << 32) | set
    }

    #[test]
    fn a_set_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Set>(), 64);
        assert_eq!(std::mem::align_of::<Set>(), 64);
        let table = FallbackTable::with_capacity(64);
        assert_eq!(table.sets.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn capacity_is_rounded_up_to_a_power_of_two_of_at_least_one_set() {
        for (asked, got) in [(1, 8), (8, 8), (9, 16), (1000, 1024), (1 << 20, 1 << 20)] {
            assert_eq!(FallbackTable::rounded_capacity(asked), got);
            assert_eq!(FallbackTable::with_capacity(asked).capacity(), got);
        }
        assert_eq!(FallbackTable::default().capacity(), DEFAULT_CAPACITY);
        assert_eq!(FallbackTable::rounded_capacity(MAX_CAPACITY), MAX_CAPACITY);
    }

    #[test]
    #[should_panic(expected = "capacity")]
    fn zero_capacity_is_refused() {
        let _ = FallbackTable::with_capacity(0);
    }

    #[test]
    fn lookup_finds_what_insert_stored_and_remove_forgets_it() {
        let table = FallbackTable::with_capacity(64);
        assert!(table.is_empty());
        for n in 0..40u32 {
            let h = hash(u64::from(n % 8), n);
            assert_eq!(
                table.insert(h, ServerId(n as u16 + 1), at(1)),
                Insert::Added
            );
        }
        assert_eq!(table.len(), 40);
        for n in 0..40u32 {
            let h = hash(u64::from(n % 8), n);
            assert_eq!(table.lookup(h, at(2)), Some(ServerId(n as u16 + 1)));
            assert_eq!(table.peek(h), Some(ServerId(n as u16 + 1)));
        }
        // Same set, unknown tag; known tag, other set.
        assert_eq!(table.lookup(hash(0, 999), at(2)), None);
        assert_eq!(table.lookup(hash(1, 0), at(2)), None);
        assert_eq!(table.remove(hash(3, 3)), Some(ServerId(4)));
        assert_eq!(table.remove(hash(3, 3)), None);
        assert_eq!(table.lookup(hash(3, 3), at(3)), None);
        assert_eq!(table.len(), 39);
        table.clear();
        assert!(table.is_empty());
    }

    #[test]
    fn the_top_server_id_and_time_round_trip() {
        let table = FallbackTable::with_capacity(8);
        let h = hash(0, u32::MAX);
        table.insert(h, ServerId(ServerId::MAX), at(0xffff));
        assert_eq!(table.peek(h), Some(ServerId(ServerId::MAX)));
        table.insert(h, ServerId(0), at(0x1_0000));
        assert_eq!(table.peek(h), Some(ServerId(0)));
    }

    #[test]
    fn insert_of_a_present_flow_updates_it_in_place() {
        let table = FallbackTable::with_capacity(8);
        let h = hash(0, 7);
        assert_eq!(table.insert(h, ServerId(1), at(1)), Insert::Added);
        assert_eq!(table.insert(h, ServerId(2), at(1)), Insert::Updated);
        assert_eq!(table.insert(h, ServerId(2), at(1)), Insert::Updated);
        assert_eq!(table.len(), 1);
        assert_eq!(table.peek(h), Some(ServerId(2)));
    }

    #[test]
    fn a_full_set_evicts_its_least_recently_used_flow() {
        let table = FallbackTable::with_capacity(16);
        for n in 0..8u32 {
            table.insert(hash(1, n), ServerId(1), at(10 + u64::from(n)));
        }
        // Flow 0 is used again: flow 1 is now the oldest.
        assert_eq!(table.lookup(hash(1, 0), at(20)), Some(ServerId(1)));
        assert_eq!(
            table.insert(hash(1, 100), ServerId(2), at(21)),
            Insert::Evicted
        );
        assert_eq!(table.peek(hash(1, 1)), None);
        assert_eq!(table.peek(hash(1, 0)), Some(ServerId(1)));
        assert_eq!(table.peek(hash(1, 100)), Some(ServerId(2)));
        // The other set is untouched.
        assert_eq!(table.insert(hash(0, 1), ServerId(3), at(22)), Insert::Added);
        // Across the time field's wrap, age is still measured forward.
        assert_eq!(
            table.insert(hash(1, 101), ServerId(2), at(0x1_0000 + 3)),
            Insert::Evicted
        );
        assert_eq!(table.peek(hash(1, 2)), None);
    }

    /// `count` words aligned to a set, that live for the rest of the test process.
    fn leaked_words(count: usize) -> &'static [AtomicU64] {
        let sets: &'static [Set] = Box::leak((0..count / WAYS).map(|_| Set::empty()).collect());
        // SAFETY: a `Set` is `WAYS` words.
        unsafe { std::slice::from_raw_parts(sets.as_ptr().cast::<AtomicU64>(), count) }
    }

    #[test]
    fn a_table_over_borrowed_words_keeps_its_flows_in_them() {
        let words = leaked_words(32);
        words[9].store(0xdead, Relaxed);
        let table = FallbackTable::with_words(words);
        assert_eq!(table.sets(), 4);
        assert!(table.is_empty(), "the words are cleared");
        let h = hash(1, 77);
        assert_eq!(table.insert(h, ServerId(12), at(3)), Insert::Added);
        // Set 1, way 0: the word a lookup elsewhere (the XDP program) reads.
        assert_eq!(words[WAYS].load(Relaxed), pack(77, ServerId(12), 3));
        drop(table);
        assert_eq!(words[WAYS].load(Relaxed), pack(77, ServerId(12), 3));
        assert_eq!(FallbackTable::with_words(words).lookup(h, at(3)), None);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn borrowed_words_come_in_whole_sets() {
        FallbackTable::with_words(&leaked_words(16)[..12]);
    }

    #[test]
    #[should_panic(expected = "aligned")]
    fn borrowed_words_start_on_a_set() {
        FallbackTable::with_words(&leaked_words(24)[1..17]);
    }

    #[test]
    fn lookups_write_the_line_only_when_the_time_unit_changes() {
        let table = FallbackTable::with_capacity(8);
        let h = hash(0, 5);
        table.insert(h, ServerId(3), 0);
        let word = |t: &FallbackTable| t.sets[0].0[0].load(Relaxed);
        let before = word(&table);
        table.lookup(h, NANOS_PER_SEC / 2);
        assert_eq!(word(&table), before, "same unit: no store");
        table.lookup(h, 2 * NANOS_PER_SEC);
        assert_ne!(word(&table), before);
        assert_eq!(unit_of(word(&table)), unit(2 * NANOS_PER_SEC));
        // peek never writes.
        let before = word(&table);
        table.peek(h);
        table.peek(h);
        assert_eq!(word(&table), before);
    }

    #[test]
    fn a_duplicate_tag_shadows_nothing_and_remove_clears_both() {
        // Two workers inserting the same flow at once can both find no match and take two
        // ways; the first is the one lookups and updates use.
        let table = FallbackTable::with_capacity(8);
        let h = hash(0, 42);
        table.sets[0].0[3].store(pack(42, ServerId(5), 1), Relaxed);
        table.sets[0].0[6].store(pack(42, ServerId(6), 1), Relaxed);
        assert_eq!(table.lookup(h, at(1)), Some(ServerId(5)));
        assert_eq!(table.insert(h, ServerId(7), at(1)), Insert::Updated);
        assert_eq!(table.lookup(h, at(1)), Some(ServerId(7)));
        assert_eq!(table.remove(h), Some(ServerId(7)));
        assert_eq!(table.lookup(h, at(1)), None);
        assert!(table.is_empty());
    }

    #[test]
    fn a_restart_takes_over_every_flow_with_its_age() {
        let old = FallbackTable::with_capacity(64);
        for n in 0..20u32 {
            old.insert(
                hash(u64::from(n % 8), n),
                ServerId(n as u16),
                at(100 + u64::from(n)),
            );
        }
        let saved = old.export(at(130));
        assert_eq!(saved.len(), 20);
        assert!(saved.contains(&SavedFlow {
            set: 3,
            tag: 11,
            server: ServerId(11),
            idle_units: 19,
        }));
        // The next process's clock starts again from 0; 5 units went by in between.
        let new = FallbackTable::with_capacity(64);
        assert_eq!(new.import(old.sets(), &saved, 5, at(2)), 20);
        for n in 0..20u32 {
            assert_eq!(
                new.peek(hash(u64::from(n % 8), n)),
                Some(ServerId(n as u16))
            );
        }
        assert_eq!(
            new.export(at(2))
                .iter()
                .find(|f| f.tag == 11)
                .map(|f| f.idle_units),
            Some(24)
        );
        // A smaller table places every flow by its low set bits; a bigger one takes none.
        let smaller = FallbackTable::with_capacity(16);
        assert_eq!(smaller.import(old.sets(), &saved, 0, at(2)), 20);
        assert_eq!(smaller.peek(hash(3, 11)), Some(ServerId(11)));
        assert_eq!(smaller.len(), 16, "two sets of 8");
        let bigger = FallbackTable::with_capacity(128);
        assert_eq!(bigger.import(old.sets(), &saved, 0, at(2)), 0);
        assert!(bigger.is_empty());
    }

    /// Per set, a true LRU of up to 8 flows by last use: what the table must do when every
    /// operation comes at a later time unit (so "oldest" is never a tie).
    #[derive(Default)]
    struct Model {
        sets: std::collections::HashMap<u64, Vec<(u32, u16, u64)>>,
    }

    impl Model {
        fn lookup(&mut self, set: u64, tag: u32, t: u64) -> Option<u16> {
            let ways = self.sets.entry(set).or_default();
            let entry = ways.iter_mut().find(|e| e.0 == tag)?;
            entry.2 = t;
            Some(entry.1)
        }

        fn insert(&mut self, set: u64, tag: u32, server: u16, t: u64) -> Insert {
            let ways = self.sets.entry(set).or_default();
            if let Some(entry) = ways.iter_mut().find(|e| e.0 == tag) {
                *entry = (tag, server, t);
                return Insert::Updated;
            }
            if ways.len() < WAYS {
                ways.push((tag, server, t));
                return Insert::Added;
            }
            let oldest = (0..ways.len()).min_by_key(|&i| ways[i].2).unwrap();
            ways[oldest] = (tag, server, t);
            Insert::Evicted
        }

        fn remove(&mut self, set: u64, tag: u32) -> Option<u16> {
            let ways = self.sets.entry(set).or_default();
            let i = ways.iter().position(|e| e.0 == tag)?;
            Some(ways.remove(i).1)
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Lookup(u64, u32),
        Insert(u64, u32, u16),
        Remove(u64, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Two sets and a dozen tags each: full sets, evictions, hits and misses.
        let set = 0u64..2;
        let tag = prop_oneof![0u32..12, Just(u32::MAX)];
        prop_oneof![
            3 => (set.clone(), tag.clone()).prop_map(|(s, t)| Op::Lookup(s, t)),
            4 => (set.clone(), tag.clone(), 0..=ServerId::MAX).prop_map(|(s, t, v)| Op::Insert(s, t, v)),
            1 => (set, tag).prop_map(|(s, t)| Op::Remove(s, t)),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_per_set_lru_model(ops in proptest::collection::vec(op(), 0..300)) {
            let table = FallbackTable::with_capacity(16);
            let mut model = Model::default();
            for (i, op) in ops.iter().enumerate() {
                let t = 1 + i as u64;
                match *op {
                    Op::Lookup(s, tag) => prop_assert_eq!(
                        table.lookup(hash(s, tag), at(t)).map(|v| v.0),
                        model.lookup(s, tag, t),
                        "{:?}", op
                    ),
                    Op::Insert(s, tag, v) => prop_assert_eq!(
                        table.insert(hash(s, tag), ServerId(v), at(t)),
                        model.insert(s, tag, v, t),
                        "{:?}", op
                    ),
                    Op::Remove(s, tag) => prop_assert_eq!(
                        table.remove(hash(s, tag)).map(|v| v.0),
                        model.remove(s, tag),
                        "{:?}", op
                    ),
                }
                let live: usize = model.sets.values().map(Vec::len).sum();
                prop_assert_eq!(table.len(), live);
            }
        }
    }

    /// The server a concurrency-test flow must map to, if it maps to any.
    fn owner(h: u64) -> ServerId {
        ServerId(((h >> 32) % u64::from(ServerId::MAX)) as u16)
    }

    /// Two threads insert, look up and remove flows of one small table (a few sets, so they
    /// meet on every line), with their own flows and flows they share. Whatever the
    /// interleaving, a lookup finds nothing or the flow's own server, never another flow's,
    /// and the table never holds more than its capacity.
    #[test]
    fn two_workers_never_see_another_flows_server() {
        let table = Arc::new(FallbackTable::with_capacity(32));
        // Distinct tags, so no answer can be a tag collision.
        let flows = |thread: u64| -> Vec<u64> {
            (0..64u64)
                .map(|i| {
                    let shared = i % 4 == 0;
                    let id = if shared { i } else { thread * 1000 + i };
                    ((id + 1) << 32) | (i % 4)
                })
                .collect()
        };
        let start = Arc::new(std::sync::Barrier::new(2));
        let handles: Vec<_> = (0..2u64)
            .map(|thread| {
                let table = Arc::clone(&table);
                let start = Arc::clone(&start);
                let flows = flows(thread);
                std::thread::spawn(move || {
                    let (mut found, mut lookups) = (0u64, 0u64);
                    start.wait();
                    for round in 0..200_000u64 {
                        let now = at(round / 64);
                        let h = flows[(round * 7 + thread) as usize % flows.len()];
                        match round % 5 {
                            0 | 1 => {
                                table.insert(h, owner(h), now);
                            }
                            4 if round % 15 == 4 => {
                                if let Some(server) = table.remove(h) {
                                    assert_eq!(server, owner(h));
                                }
                            }
                            _ => {
                                lookups += 1;
                                if let Some(server) = table.lookup(h, now) {
                                    assert_eq!(server, owner(h), "flow {h:#x}");
                                    found += 1;
                                }
                            }
                        }
                    }
                    (found, lookups)
                })
            })
            .collect();
        for handle in handles {
            let (found, lookups) = handle.join().unwrap();
            assert!(
                found > lookups / 10,
                "only {found} of {lookups} lookups hit"
            );
        }
        assert!(table.len() <= table.capacity());
        for set in table.sets.iter() {
            for way in &set.0 {
                let word = way.load(Relaxed);
                if word & VALID != 0 {
                    let h = (word & TAG_MASK) << 32;
                    assert_eq!(server_of(word), owner(h));
                }
            }
        }
    }
}
