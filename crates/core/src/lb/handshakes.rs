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

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::types::ServerId;

/// 2 MiB of slots per LB process.
pub const DEFAULT_SLOTS: usize = 1 << 18;

const VALID: u64 = 1 << 63;
/// A SYN-ACK for this SYN has passed the LB.
const ANSWERED: u64 = 1 << 62;
const HOLDER_SHIFT: u32 = 32;
const HOLDER_MASK: u64 = 0x7fff;

/// Recent SYNs and the server holding each one's load count, shared by all workers.
pub struct HandshakeTable {
    slots: Box<[AtomicU64]>,
    mask: usize,
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
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            mask: slots - 1,
        }
    }

    /// Forgets every entry (tests and the fuzz harness reuse one table across runs).
    pub fn clear(&self) {
        for slot in self.slots.iter() {
            slot.store(0, Relaxed);
        }
    }

    #[inline]
    fn slot(&self, flow_hash: u64) -> &AtomicU64 {
        &self.slots[flow_hash as usize & self.mask]
    }

    /// Identifies (connection, client ISN) within a slot. The slot index takes the low
    /// bits of the hash, the fingerprint its high half, so two SYNs sharing a slot are told
    /// apart with 32 independent bits.
    #[inline]
    fn fingerprint(flow_hash: u64, client_isn: u32) -> u64 {
        ((flow_hash >> 32) as u32 ^ client_isn) as u64
    }

    #[inline]
    fn holder(entry: u64) -> ServerId {
        ServerId(((entry >> HOLDER_SHIFT) & HOLDER_MASK) as u16)
    }

    #[inline]
    fn matches(entry: u64, fingerprint: u64) -> bool {
        entry & VALID != 0 && entry & 0xffff_ffff == fingerprint
    }

    /// A SYN with `client_isn` was given to `server`, whose count the caller raised. If the
    /// same SYN was seen before, returns the server it was given then, whose count the
    /// caller must lower: the client has stopped waiting for that server's answer.
    #[inline]
    pub fn on_syn(&self, flow_hash: u64, client_isn: u32, server: ServerId) -> Option<ServerId> {
        let fingerprint = Self::fingerprint(flow_hash, client_isn);
        let entry = VALID | ((server.0 as u64 & HOLDER_MASK) << HOLDER_SHIFT) | fingerprint;
        let previous = self.slot(flow_hash).swap(entry, Relaxed);
        Self::matches(previous, fingerprint).then(|| Self::holder(previous))
    }

    /// `server` answered the SYN with `client_isn` (its SYN-ACK acknowledges
    /// `client_isn + 1`). If this is the first answer to pass the LB and another server
    /// holds the count, returns that server: the caller moves the count from it to
    /// `server`.
    #[inline]
    pub fn on_syn_ack(
        &self,
        flow_hash: u64,
        client_isn: u32,
        server: ServerId,
    ) -> Option<ServerId> {
        let fingerprint = Self::fingerprint(flow_hash, client_isn);
        let mut moved_from = None;
        let _ = self
            .slot(flow_hash)
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

    #[test]
    fn a_first_syn_releases_nothing() {
        let table = HandshakeTable::with_slots(64);
        assert_eq!(table.on_syn(HASH, ISN, A), None);
    }

    #[test]
    fn a_retransmitted_syn_releases_the_previous_pick_whichever_it_was() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(HASH, ISN, A);
        assert_eq!(table.on_syn(HASH, ISN, B), Some(A));
        // Given to the same server again: that server's second count is the one to drop.
        assert_eq!(table.on_syn(HASH, ISN, B), Some(B));
    }

    #[test]
    fn a_new_connection_on_the_same_ports_is_not_a_retransmission() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(HASH, ISN, A);
        assert_eq!(table.on_syn(HASH, ISN.wrapping_add(1_000_000), B), None);
    }

    #[test]
    fn the_first_syn_ack_to_pass_takes_the_count_and_later_ones_do_not() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(HASH, ISN, A);
        table.on_syn(HASH, ISN, B);
        // The first server's SYN-ACK retransmission wins the race to the client.
        assert_eq!(table.on_syn_ack(HASH, ISN, A), Some(B));
        // The second server's answer comes later: the client challenges it, nothing moves.
        assert_eq!(table.on_syn_ack(HASH, ISN, B), None);
        assert_eq!(table.on_syn_ack(HASH, ISN, A), None);
    }

    #[test]
    fn the_holders_own_answer_moves_nothing() {
        let table = HandshakeTable::with_slots(64);
        table.on_syn(HASH, ISN, A);
        table.on_syn(HASH, ISN, B);
        assert_eq!(table.on_syn_ack(HASH, ISN, B), None);
        // The first server's late SYN-ACK retransmissions leave the count with the second.
        assert_eq!(table.on_syn_ack(HASH, ISN, A), None);
    }

    #[test]
    fn a_syn_ack_for_an_unknown_syn_moves_nothing() {
        let table = HandshakeTable::with_slots(64);
        assert_eq!(table.on_syn_ack(HASH, ISN, A), None);
        table.on_syn(HASH, ISN, A);
        assert_eq!(table.on_syn_ack(HASH, ISN.wrapping_add(1), B), None);
    }

    #[test]
    fn a_syn_retried_after_an_answer_is_still_a_retransmission() {
        // The SYN-ACK passed the LB but was lost on the way to the client.
        let table = HandshakeTable::with_slots(64);
        table.on_syn(HASH, ISN, A);
        table.on_syn_ack(HASH, ISN, A);
        assert_eq!(table.on_syn(HASH, ISN, B), Some(A));
        assert_eq!(table.on_syn_ack(HASH, ISN, B), None);
    }

    #[test]
    fn an_overwritten_slot_forgets_without_misattributing() {
        let table = HandshakeTable::with_slots(1);
        table.on_syn(HASH, ISN, A);
        table.on_syn(!HASH, 7, B);
        assert_eq!(table.on_syn(HASH, ISN, B), None);
        table.clear();
        assert_eq!(table.on_syn(!HASH, 7, A), None);
    }
}
