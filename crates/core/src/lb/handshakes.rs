//! Which server holds the load count of a connection that is still being opened.
//!
//! The active-connection estimate adds one when a policy picks a server for a SYN. When the
//! SYN or the server's SYN-ACK is lost, the client retransmits its SYN after about a
//! second, and the policy picks again, usually another server. Only one of the two can end
//! up with the connection, and real Linux never tells the other one: the client answers
//! the other server's late SYN-ACK with a challenge ACK that echoes the cookie of the
//! server it is established with, so the half-open server never gets the ACK it could
//! answer with a RST; it retransmits its SYN-ACK a few times and drops the half-open
//! connection silently (docs/design.md, "A retried SYN"). Without this table the first
//! pick's count would stay raised until a load report replaced it.
//!
//! The table remembers, per recent SYN, the server that holds its count, keyed by the
//! connection and the client's initial sequence number (a retransmitted SYN carries the
//! same ISN; a new connection on the same addresses and ports does not):
//!
//! - a SYN whose (connection, ISN) is already there is a retransmission: the count of the
//!   server it was given before is released, and the new pick holds it;
//! - the first SYN-ACK for that (connection, ISN) that passes the LB names the server the
//!   client will most likely be established with (SYN-ACKs reach the client in the order
//!   the LB forwards them): if it is not the holder, the count moves to it. Later SYN-ACKs
//!   (retransmissions, or the other server's answer) change nothing.
//!
//! It is a cache, not a connection table: one word per slot, direct-mapped by the flow
//! hash, shared by every worker (a SYN and its SYN-ACK arrive on different interfaces, so
//! usually on different workers). A SYN that lands in a slot overwrites whatever was there;
//! a lost entry only means the estimate is as before (one count too many until a report).
//! At [`DEFAULT_SLOTS`] slots an entry survives about `slots / SYN rate` seconds: 2.6 s at
//! 100 000 new connections a second, longer than the first SYN retransmission (1 s).
//!
//! Only a SYN-ACK that follows a retransmitted SYN can move a count: after a single SYN,
//! the only server that can answer is the one holding the count. So a retransmission also
//! marks its connection in a small filter of recent retries (8 KiB, in cache), and a
//! SYN-ACK reads the big table only when its connection was marked in the last
//! [`RETRY_MEMORY_UNITS`]: the table is 2 MiB of random accesses, a cache miss per SYN-ACK
//! that the common case (no retry) does not pay. A mark shared by two connections only
//! makes the other's SYN-ACK read the table, which then decides as before.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};

use crate::types::{Nanos, ServerId};
use crate::words::Words;

/// 2 MiB of slots per LB process.
pub const DEFAULT_SLOTS: usize = 1 << 18;

const VALID: u64 = 1 << 63;
/// A SYN-ACK for this SYN has passed the LB.
const ANSWERED: u64 = 1 << 62;
const HOLDER_SHIFT: u32 = 32;
const HOLDER_MASK: u64 = 0x7fff;

/// Slots of the recent-retry filter (two bytes each).
pub const RETRY_SLOTS: usize = 1 << 12;
/// The filter's clock: `now >> RETRY_UNIT_SHIFT`, units of 1.07 s.
const RETRY_UNIT_SHIFT: u32 = 30;
/// How long a retry mark lasts: 68.7 s, more than Linux waits for an answer after its
/// last SYN retransmission (32 s at the default `tcp_syn_retries` of 6, 64 s at 7).
pub const RETRY_MEMORY_UNITS: u16 = 64;
/// A filter slot holds `MARKED | (time unit & UNIT_MASK)`; 0 is "never marked".
const MARKED: u16 = 0x8000;
const UNIT_MASK: u16 = 0x7fff;

/// One opening of a connection: the connection (its flow hash) and the client's initial
/// sequence number, which a retransmitted SYN repeats and a new connection on the same
/// addresses and ports does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    pub flow_hash: u64,
    pub client_isn: u32,
}

impl Handshake {
    #[inline]
    pub fn new(flow_hash: u64, client_isn: u32) -> Self {
        Handshake {
            flow_hash,
            client_isn,
        }
    }

    /// Identifies the handshake within a slot. The slot index takes the low bits of the
    /// hash, the fingerprint its high half, so two SYNs sharing a slot are told apart with
    /// 32 independent bits.
    #[inline]
    fn fingerprint(self) -> u64 {
        ((self.flow_hash >> 32) as u32 ^ self.client_isn) as u64
    }
}

/// Recent SYNs and the server holding each one's load count, shared by all workers (and
/// by the XDP program's in-kernel path, which books SYNs in the same words:
/// [`with_words`](Self::with_words)).
pub struct HandshakeTable {
    slots: Words<AtomicU64>,
    mask: usize,
    /// When each (hashed) connection last had a SYN retransmitted.
    retries: Words<AtomicU16>,
}

impl Default for HandshakeTable {
    fn default() -> Self {
        Self::with_slots(DEFAULT_SLOTS)
    }
}

impl HandshakeTable {
    /// `slots` is rounded up to a power of two (at least 1).
    pub fn with_slots(slots: usize) -> Self {
        let slots = slots.max(1).next_power_of_two();
        HandshakeTable {
            slots: Words::owned((0..slots).map(|_| AtomicU64::new(0)).collect()),
            mask: slots - 1,
            retries: Words::owned((0..RETRY_SLOTS).map(|_| AtomicU16::new(0)).collect()),
        }
    }

    /// A table over the caller's words, which live as long as the process: e.g. the XDP
    /// program's mmapped `handshakes` array, so that the kernel and the workers book SYNs
    /// in one table. `slots.len()` must be a power of two. The words are cleared: a table
    /// starts knowing no SYN.
    pub fn with_words(
        slots: &'static [AtomicU64],
        retries: &'static [AtomicU16; RETRY_SLOTS],
    ) -> Self {
        let table = Self::with_kept_words(slots, retries);
        table.clear();
        table
    }

    /// [`with_words`](Self::with_words) knowing the SYNs the words hold: words an earlier
    /// process filled (a pinned map), so that a SYN retransmitted across a restart is
    /// still a retransmission. Their times are the core's clock's, which must continue.
    pub fn with_kept_words(
        slots: &'static [AtomicU64],
        retries: &'static [AtomicU16; RETRY_SLOTS],
    ) -> Self {
        assert!(
            slots.len().is_power_of_two(),
            "a handshake table has a power of two of slots, not {}",
            slots.len()
        );
        HandshakeTable {
            slots: Words::borrowed(slots),
            mask: slots.len() - 1,
            retries: Words::borrowed(retries),
        }
    }

    /// Forgets every entry (tests and the fuzz harness reuse one table across runs).
    pub fn clear(&self) {
        for slot in self.slots.iter() {
            slot.store(0, Relaxed);
        }
        for mark in self.retries.iter() {
            mark.store(0, Relaxed);
        }
    }

    /// Forgets whatever SYN the slot of `flow_hash` holds (a bench replays one SYN as a
    /// new one every time).
    pub fn forget(&self, flow_hash: u64) {
        self.slot(flow_hash).store(0, Relaxed);
    }

    #[inline]
    fn retry_mark(&self, flow_hash: u64) -> &AtomicU16 {
        // Bits the slot index and the fingerprint use least.
        &self.retries[(flow_hash >> 20) as usize % RETRY_SLOTS]
    }

    #[inline]
    fn unit(now: Nanos) -> u16 {
        (now >> RETRY_UNIT_SHIFT) as u16 & UNIT_MASK
    }

    /// Whether a SYN of this connection was retransmitted recently, so that its SYN-ACK
    /// may have to move a count ([`on_syn_ack`](Self::on_syn_ack) asks this first; the
    /// straight line asks it to leave such SYN-ACKs to the general path).
    #[inline]
    pub fn retried_recently(&self, flow_hash: u64, now: Nanos) -> bool {
        let mark = self.retry_mark(flow_hash).load(Relaxed);
        mark & MARKED != 0
            && Self::unit(now).wrapping_sub(mark & UNIT_MASK) & UNIT_MASK < RETRY_MEMORY_UNITS
    }

    #[inline]
    fn slot(&self, flow_hash: u64) -> &AtomicU64 {
        &self.slots[flow_hash as usize & self.mask]
    }

    #[inline]
    fn holder(entry: u64) -> ServerId {
        ServerId(((entry >> HOLDER_SHIFT) & HOLDER_MASK) as u16)
    }

    #[inline]
    fn matches(entry: u64, fingerprint: u64) -> bool {
        entry & VALID != 0 && entry & 0xffff_ffff == fingerprint
    }

    /// The SYN of `syn` was given to `server`, whose count the caller raised. If the same
    /// SYN was seen before, returns the server it was given then, whose count the caller
    /// must lower: the client has stopped waiting for that server's answer.
    #[inline]
    pub fn on_syn(&self, syn: Handshake, server: ServerId, now: Nanos) -> Option<ServerId> {
        let fingerprint = syn.fingerprint();
        let entry = VALID | ((server.0 as u64 & HOLDER_MASK) << HOLDER_SHIFT) | fingerprint;
        let previous = self.slot(syn.flow_hash).swap(entry, Relaxed);
        if !Self::matches(previous, fingerprint) {
            return None;
        }
        self.retry_mark(syn.flow_hash)
            .store(MARKED | Self::unit(now), Relaxed);
        Some(Self::holder(previous))
    }

    /// `server` answered the SYN of `syn` (its SYN-ACK acknowledges `client_isn + 1`). If
    /// this is the first answer to pass the LB and another server holds the count, returns
    /// that server: the caller moves the count from it to `server`.
    #[inline]
    pub fn on_syn_ack(&self, syn: Handshake, server: ServerId, now: Nanos) -> Option<ServerId> {
        if !self.retried_recently(syn.flow_hash, now) {
            return None;
        }
        let fingerprint = syn.fingerprint();
        let mut moved_from = None;
        let _ = self
            .slot(syn.flow_hash)
            .fetch_update(Relaxed, Relaxed, |entry| {
                moved_from = None;
                if !Self::matches(entry, fingerprint) || entry & ANSWERED != 0 {
                    return None;
                }
                let holder = Self::holder(entry);
                if holder != server {
                    moved_from = Some(holder);
                }
                Some(
                    (entry & !(HOLDER_MASK << HOLDER_SHIFT))
                        | ANSWERED
                        | ((server.0 as u64 & HOLDER_MASK) << HOLDER_SHIFT),
                )
            });
        moved_from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ServerId = ServerId(1);
    const B: ServerId = ServerId(2);
    const HASH: u64 = 0x1234_5678_9abc_def0;
    const ISN: u32 = 3_409_297_211;
    const NOW: Nanos = 1_000_000_000_000;
    const KEY: Handshake = Handshake {
        flow_hash: HASH,
        client_isn: ISN,
    };

    #[test]
    fn a_first_syn_releases_nothing() {
        let table = HandshakeTable::with_slots(64);
        assert_eq!(table.on_syn(KEY, A, NOW), None);
    }

    #[test]
    fn a_retransmitted_syn_releases_the_previous_pick_whichever_it_was() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(KEY, A, NOW);
        assert_eq!(table.on_syn(KEY, B, NOW), Some(A));
        // Given to the same server again: that server's second count is the one to drop.
        assert_eq!(table.on_syn(KEY, B, NOW), Some(B));
    }

    #[test]
    fn a_new_connection_on_the_same_ports_is_not_a_retransmission() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(KEY, A, NOW);
        assert_eq!(
            table.on_syn(Handshake::new(HASH, ISN.wrapping_add(1_000_000)), B, NOW),
            None
        );
    }

    #[test]
    fn the_first_syn_ack_to_pass_takes_the_count_and_later_ones_do_not() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(KEY, A, NOW);
        table.on_syn(KEY, B, NOW);
        // The first server's SYN-ACK retransmission wins the race to the client.
        assert_eq!(table.on_syn_ack(KEY, A, NOW), Some(B));
        // The second server's answer comes later: the client challenges it, nothing moves.
        assert_eq!(table.on_syn_ack(KEY, B, NOW), None);
        assert_eq!(table.on_syn_ack(KEY, A, NOW), None);
    }

    #[test]
    fn the_holders_own_answer_moves_nothing() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(KEY, A, NOW);
        table.on_syn(KEY, B, NOW);
        assert_eq!(table.on_syn_ack(KEY, B, NOW), None);
        // The first server's late SYN-ACK retransmissions leave the count with the second.
        assert_eq!(table.on_syn_ack(KEY, A, NOW), None);
    }

    #[test]
    fn a_syn_ack_for_an_unknown_syn_moves_nothing() {
        let table = HandshakeTable::with_slots(64);
        assert_eq!(table.on_syn_ack(KEY, A, NOW), None);
        table.on_syn(KEY, A, NOW);
        table.on_syn(KEY, A, NOW);
        assert!(table.retried_recently(HASH, NOW));
        assert_eq!(
            table.on_syn_ack(Handshake::new(HASH, ISN.wrapping_add(1)), B, NOW),
            None
        );
    }

    #[test]
    fn a_syn_retried_after_an_answer_is_still_a_retransmission() {
        // The SYN-ACK passed the LB but was lost on the way to the client.
        let table = HandshakeTable::with_slots(64);
        table.on_syn(KEY, A, NOW);
        table.on_syn_ack(KEY, A, NOW);
        assert_eq!(table.on_syn(KEY, B, NOW), Some(A));
        assert_eq!(table.on_syn_ack(KEY, B, NOW), None);
    }

    #[test]
    fn an_overwritten_slot_forgets_without_misattributing() {
        let table = HandshakeTable::with_slots(1);
        table.on_syn(KEY, A, NOW);
        table.on_syn(Handshake::new(!HASH, 7), B, NOW);
        assert_eq!(table.on_syn(KEY, B, NOW), None);
        table.clear();
        assert_eq!(table.on_syn(Handshake::new(!HASH, 7), A, NOW), None);
    }

    #[test]
    fn a_table_over_borrowed_words_books_in_them() {
        let slots: &'static [AtomicU64] =
            Box::leak((0..64).map(|_| AtomicU64::new(u64::MAX)).collect());
        let retries: &'static [AtomicU16; RETRY_SLOTS] =
            Box::leak(Box::new(std::array::from_fn(|_| AtomicU16::new(1))));
        let table = HandshakeTable::with_words(slots, retries);
        assert!(slots.iter().all(|w| w.load(Relaxed) == 0), "cleared");
        assert!(retries.iter().all(|w| w.load(Relaxed) == 0), "cleared");
        table.on_syn(KEY, A, NOW);
        assert_ne!(slots[HASH as usize & 63].load(Relaxed), 0);
        assert_eq!(table.on_syn(KEY, B, NOW), Some(A));
        assert!(retries.iter().any(|w| w.load(Relaxed) != 0));
    }

    #[test]
    fn only_a_recent_retry_sends_a_syn_ack_to_the_table() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(KEY, A, NOW);
        assert!(!table.retried_recently(HASH, NOW));
        table.on_syn(KEY, B, NOW);
        assert!(table.retried_recently(HASH, NOW));
        let second = 1_000_000_000;
        assert!(table.retried_recently(HASH, NOW + 60 * second));
        // Long after the client stopped waiting, the mark has expired.
        assert!(!table.retried_recently(HASH, NOW + 70 * second));
        assert_eq!(table.on_syn_ack(KEY, A, NOW + 70 * second), None);
        assert_eq!(table.on_syn_ack(KEY, A, NOW + 60 * second), Some(B));
    }
}
