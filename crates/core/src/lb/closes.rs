//! Which server FINs and RSTs lower a server's active-connection count: once per
//! connection, and never for an RST a client can draw at will.
//!
//! The count goes up when a policy places a connection and down when the server closes
//! one. Counting every server segment with FIN or RST as a close would let a client steer
//! the load-aware policies (least-loaded, pow2) onto a server by driving its count to 0:
//!
//! - **replayed segments**: a client that replays an old segment of a closed connection
//!   (its cookie still names the server) draws an RST per packet from the server's kernel,
//!   which no longer knows the connection;
//! - **retransmitted FINs**: a client that never acknowledges the server's FIN draws a
//!   retransmission of it every RTO, up to 9 FINs in about 100 s for an orphaned socket
//!   (`tcp_orphan_retries` = 0 means 8 retries).
//!
//! So, in cheetah mode (the baselines place no connection by a policy, so they count no
//! close either), a close counts when:
//!
//! - it is a FIN, or an RST that carries a **TCP timestamp option**. Linux puts the options
//!   of the connection on an RST that aborts a connection (`tcp_send_active_reset` goes
//!   through `tcp_transmit_skb`), so such an RST carries a timestamp when the connection
//!   negotiated them; the RST it sends for a segment of a connection it does not know
//!   (`tcp_v4_send_reset`) carries none. Both checked live on the testbed (kernel 6.18) by
//!   `crates/cheetah/tests/live_closes.rs`. An RST without a timestamp never counts, also
//!   for a connection without timestamps: the estimate of a server whose no-timestamp
//!   connections end in RSTs, or which refuses connections (an RST to each SYN), drifts up
//!   until a load report replaces it;
//! - and it is the **first** close of its connection seen by this LB process: a small
//!   filter shared by every worker remembers, per slot, the last close that landed there.
//!
//! The filter is [`DEFAULT_SLOTS`] 32-bit words, direct-mapped by the low bits of the flow
//! hash. A slot holds a tag made of 32 other bits of the flow hash mixed with the sequence
//! number the close occupies: for a FIN, its sequence number plus its data (and SYN)
//! length, which every retransmission of it repeats however the data before it is
//! re-segmented; for an RST, its sequence number minus one, so that the RST a server sends
//! after its FIN (one past the FIN) has the FIN's key. A new connection on the same
//! addresses and ports starts from another ISN, so its close has another key and counts.
//! A close counts when its slot holds another tag, which it then writes in: a relaxed load
//! and, for a first close only, a plain store. Not an atomic swap: a locked instruction per
//! FIN cost the `cheetah bench` server row 1.4 ns a packet more (docs/benchmarks.md), and
//! what it would settle, two workers seeing the same close at the same instant, needs one
//! connection's server segments on two receive queues at once (the RST after a FIN comes
//! from the same socket, a retransmission an RTO later); it would cost one extra
//! decrement, clamped at 0.
//!
//! Its honest limits:
//!
//! - a slot taken by another close between a FIN and its retransmission makes the
//!   retransmission count again: one extra decrement (clamped at 0). With `R` closes a
//!   second across the process, a gap of `T` seconds is lost with probability
//!   `1 - exp(-R·T / 65536)`. Linux's gaps between the 9 FINs of an orphaned socket's
//!   retry series are 0.2, 0.4, ... 25.6 s (RTO 200 ms, doubling). At 1,000 closes/s the
//!   first retransmission is lost with 0.3% and the whole series makes 0.7 extra
//!   decrements on average; at 10,000 closes/s, 3% and 3.3; at 100,000, 26% and 6.3.
//!   Counting every FIN made 8. Reports (`active_connections`) correct what is left;
//! - two closes sharing a slot and a tag (probability 2^-32 per pair) make the second a
//!   duplicate: one decrement too few.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use super::counters::Counter;
use super::worker::WorkerState;
use crate::types::ServerId;
use crate::wire::tcp::flags::{FIN, RST, SYN};
use crate::wire::TcpSegment;
use crate::words::Words;

/// 256 KiB of slots per LB process.
pub const DEFAULT_SLOTS: usize = 1 << 16;

/// One close: the connection (its flow hash) and the sequence number the close occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Close {
    pub flow_hash: u64,
    pub seq: u32,
}

impl Close {
    /// The close a server segment with `flags` (FIN or RST set), sequence number `seq` and
    /// `data_len` bytes of data stands for. RST wins when both are set.
    #[inline]
    pub fn of_segment(flow_hash: u64, flags: u8, seq: u32, data_len: usize) -> Self {
        let seq = if flags & RST != 0 {
            // An RST after a FIN is sent one past the FIN: the same close.
            seq.wrapping_sub(1)
        } else {
            // The FIN comes after the SYN (if any) and the data.
            seq.wrapping_add(u32::from(flags & SYN != 0))
                .wrapping_add(data_len as u32)
        };
        Close { flow_hash, seq }
    }

    /// What the slot keeps: the flow hash's high half (the slot index uses its low bits)
    /// mixed with the sequence number. Never 0, the value of a slot no close has taken.
    #[inline]
    fn tag(self) -> u32 {
        ((self.flow_hash >> 32) as u32 ^ self.seq).max(1)
    }
}

/// The last close seen per slot, shared by all workers (the segments of one connection
/// may reach several workers, and an RST after a FIN often takes another queue) and, over
/// the XDP program's mmapped `closes` words ([`CloseFilter::with_words`]), with the kernel,
/// which runs the same algorithm on them (bpf/lib/closes.h).
pub struct CloseFilter {
    /// The filter's own slots, of any size, or [`DEFAULT_SLOTS`] words it shares.
    slots: Words<AtomicU32>,
    mask: usize,
}

impl Default for CloseFilter {
    fn default() -> Self {
        Self::with_slots(DEFAULT_SLOTS)
    }
}

impl CloseFilter {
    /// `slots` is rounded up to a power of two (at least 1).
    pub fn with_slots(slots: usize) -> Self {
        let slots = slots.max(1).next_power_of_two();
        CloseFilter {
            slots: Words::owned((0..slots).map(|_| AtomicU32::new(0)).collect()),
            mask: slots - 1,
        }
    }

    /// A filter of [`DEFAULT_SLOTS`] slots over `words` (e.g. the XDP program's mmapped
    /// `closes` array, so that a close the kernel counted is not counted again by a worker,
    /// nor the other way round). The words are cleared: a filter starts knowing no close.
    pub fn with_words(words: &'static [AtomicU32; DEFAULT_SLOTS]) -> Self {
        let filter = Self::with_kept_words(words);
        filter.clear();
        filter
    }

    /// [`with_words`](Self::with_words) knowing the closes the words hold: words an
    /// earlier process filled (a pinned map), whose closes stay counted.
    pub fn with_kept_words(words: &'static [AtomicU32; DEFAULT_SLOTS]) -> Self {
        CloseFilter {
            slots: Words::borrowed(words),
            mask: DEFAULT_SLOTS - 1,
        }
    }

    #[inline(always)]
    fn slots(&self) -> &[AtomicU32] {
        &self.slots
    }

    /// Forgets every close (tests, benchmarks and the fuzz harness reuse one filter).
    pub fn clear(&self) {
        for slot in self.slots() {
            slot.store(0, Relaxed);
        }
    }

    /// Records `close`; whether it is the first time (as far as its slot remembers). A load
    /// and, the first time, a store (not a swap: see the module doc).
    #[inline]
    pub fn first(&self, close: Close) -> bool {
        let tag = close.tag();
        let slot = &self.slots()[close.flow_hash as usize & self.mask];
        if slot.load(Relaxed) == tag {
            return false;
        }
        slot.store(tag, Relaxed);
        true
    }
}

impl WorkerState {
    /// A segment from `server` with FIN or RST set (`segment`: its TCP header and data, the
    /// header already checked; `stamped`: whether it carries a timestamp option, which the
    /// caller has already looked for; `flow_hash`: its connection's): lowers the server's
    /// count if it is the first close of a connection. Both server paths call this, so they count
    /// alike; out of line, as closes are a small share of replies.
    #[cold]
    #[inline(never)]
    pub(crate) fn on_server_close(
        &mut self,
        closes: &CloseFilter,
        segment: &[u8],
        stamped: bool,
        server: ServerId,
        flow_hash: u64,
    ) {
        let segment = TcpSegment::new_unchecked(segment);
        let flags = segment.flags();
        debug_assert!(flags & (FIN | RST) != 0);
        if flags & RST != 0 && !stamped {
            self.counters.inc(Counter::ResetsWithoutTimestamp);
            return;
        }
        let data_len = segment.segment_len() - segment.header_len();
        if closes.first(Close::of_segment(flow_hash, flags, segment.seq(), data_len)) {
            self.loads.on_server_close(server);
            self.counters.inc(Counter::ServerCloses);
        } else {
            self.counters.inc(Counter::DuplicateCloses);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: u64 = 0x1234_5678_9abc_def0;
    const FIN_SEQ: u32 = 2_000_000_000;

    #[test]
    fn a_retransmitted_fin_is_the_same_close() {
        let filter = CloseFilter::with_slots(64);
        let fin = Close::of_segment(HASH, FIN, FIN_SEQ, 0);
        assert!(filter.first(fin));
        assert!(!filter.first(fin));
        assert!(!filter.first(fin));
    }

    #[test]
    fn a_fin_resent_with_its_data_regrouped_is_the_same_close() {
        // First sent with 300 bytes of data; the client acked 100 of them, so the
        // retransmission starts 100 bytes later; or it is collapsed with earlier data.
        let first = Close::of_segment(HASH, FIN, FIN_SEQ - 300, 300);
        assert_eq!(first, Close::of_segment(HASH, FIN, FIN_SEQ - 200, 200));
        assert_eq!(first, Close::of_segment(HASH, FIN, FIN_SEQ - 1748, 1748));
        assert_eq!(first, Close::of_segment(HASH, FIN, FIN_SEQ, 0));
    }

    #[test]
    fn the_rst_after_a_fin_is_the_fins_close() {
        let filter = CloseFilter::with_slots(64);
        assert!(filter.first(Close::of_segment(HASH, FIN, FIN_SEQ, 0)));
        assert!(!filter.first(Close::of_segment(HASH, RST, FIN_SEQ + 1, 0)));
        assert_eq!(
            Close::of_segment(HASH, RST | FIN, FIN_SEQ + 1, 0),
            Close::of_segment(HASH, RST, FIN_SEQ + 1, 0),
            "RST wins"
        );
    }

    #[test]
    fn a_syn_fin_occupies_the_number_after_the_syn() {
        assert_eq!(Close::of_segment(HASH, SYN | FIN, 9, 0).seq, 10);
    }

    #[test]
    fn a_new_connection_on_the_same_ports_closes_anew() {
        let filter = CloseFilter::with_slots(64);
        assert!(filter.first(Close::of_segment(HASH, FIN, FIN_SEQ, 0)));
        assert!(filter.first(Close::of_segment(HASH, FIN, 77_000, 0)));
    }

    #[test]
    fn an_overwritten_slot_forgets_and_clear_forgets_all() {
        let filter = CloseFilter::with_slots(1);
        let fin = Close::of_segment(HASH, FIN, FIN_SEQ, 0);
        assert!(filter.first(fin));
        assert!(filter.first(Close::of_segment(!HASH, FIN, 5, 0)));
        assert!(filter.first(fin), "the slot was taken in between");
        filter.clear();
        assert!(filter.first(fin));
    }

    #[test]
    fn a_filter_over_shared_words_writes_them_and_starts_empty() {
        let words: &'static [AtomicU32; DEFAULT_SLOTS] =
            Box::leak(Box::new(std::array::from_fn(|_| AtomicU32::new(7))));
        let filter = CloseFilter::with_words(words);
        assert!(words.iter().all(|w| w.load(Relaxed) == 0), "cleared");
        let fin = Close::of_segment(HASH, FIN, FIN_SEQ, 0);
        assert!(filter.first(fin));
        let slot = &words[HASH as usize & (DEFAULT_SLOTS - 1)];
        assert_eq!(slot.load(Relaxed), (HASH >> 32) as u32 ^ FIN_SEQ);
        // Another filter over the same words (the kernel's view) knows the close.
        let other = CloseFilter {
            slots: Words::borrowed(words),
            mask: DEFAULT_SLOTS - 1,
        };
        assert!(!other.first(fin));
    }

    #[test]
    fn no_tag_is_the_empty_slot() {
        let close = Close {
            flow_hash: (FIN_SEQ as u64) << 32,
            seq: FIN_SEQ,
        };
        assert_ne!(close.tag(), 0);
        assert!(CloseFilter::with_slots(4).first(close));
    }
}
