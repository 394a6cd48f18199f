//! Per-worker counters, written by one worker and read by the metrics endpoint.
//!
//! A counter is written only by its worker, so an increment is a relaxed load and store
//! (plain moves on x86), not a locked read-modify-write; readers on other threads see a
//! value that is at most a few packets old. Drops have one counter per reason.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::verdict::DropReason;

macro_rules! counters {
    ($($variant:ident => $name:literal, $doc:literal;)*) => {
        /// Events counted per worker (drops are counted by [`DropReason`] separately).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Counter {
            $(#[doc = $doc] $variant,)*
        }

        impl Counter {
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];
            pub const COUNT: usize = Self::ALL.len();

            pub fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)*
                }
            }

            pub fn description(self) -> &'static str {
                match self {
                    $(Counter::$variant => $doc,)*
                }
            }
        }
    };
}

counters! {
    ToServer => "to_server", "Packets sent to a server.";
    ToClient => "to_client", "Packets sent toward a client.";
    ToAllServers => "to_all_servers", "ICMP errors without a cookie copied to every active server of the VIP.";
    Passed => "passed", "Packets handed to the host (not load-balanced traffic).";
    Dropped => "dropped", "Packets dropped (see drops by reason).";
    NewConnections => "new_connections", "SYNs placed by the VIP's policy.";
    CookieRouted => "cookie_routed", "Client packets routed by their cookie.";
    FastPath => "fast_path", "Established client packets handled by the straight-line fast path.";
    CookiesInserted => "cookies_inserted", "Server packets whose TSval now carries a cookie.";
    OptionsFastPath => "options_fast_path", "Timestamp found by one wide compare (paper Table 1).";
    OptionsSlowPath => "options_slow_path", "TCP options that needed the TLV walk.";
    FallbackConnections => "fallback_connections", "SYNs without a timestamp, placed by Maglev and remembered in the LRU.";
    FallbackHits => "fallback_hits", "Packets without a timestamp routed by the LRU.";
    FallbackMisses => "fallback_misses", "Packets without a timestamp not in the LRU, routed by Maglev.";
    FallbackLearnedFromServer => "fallback_learned_from_server", "SYN-ACKs without a timestamp that taught the LRU the server.";
    MsbLearned => "ts_msb_learned", "A server's timestamp MSB seen for the first time.";
    MsbAdvanced => "ts_msb_advanced", "A server's timestamp MSB moved forward (one per 65.5 s at 1 ms ticks).";
    ServerTsClockUnstable => "server_ts_clock_unstable", "Server timestamps going backwards or ticking too fast to correct at the LB.";
    IcmpRoutedByCookie => "icmp_routed_by_cookie", "ICMP errors routed by the cookie of the embedded packet.";
    IcmpRoutedByFallback => "icmp_routed_by_fallback", "ICMP errors about a no-timestamp connection routed by the LRU.";
    SynRetransmissions => "syn_retransmissions", "Retransmitted SYNs recognised: the count the SYN raised before is released.";
    HandshakeCountMoved => "handshake_count_moved", "SYN-ACKs of a server other than the last pick that passed first: the connection's count moved to that server.";
    SnapshotReloads => "snapshot_reloads", "New table snapshots picked up by this worker.";
    LoadMerges => "load_merges", "Merges of this worker's load deltas into the shared totals.";
}

/// One worker's counters, packed: the handful a packet bumps share one or two cache lines,
/// which only this worker writes.
pub struct WorkerCounters {
    events: Box<[AtomicU64]>,
    drops: Box<[AtomicU64]>,
}

impl Default for WorkerCounters {
    fn default() -> Self {
        WorkerCounters {
            events: (0..Counter::COUNT).map(|_| AtomicU64::new(0)).collect(),
            drops: (0..DropReason::COUNT).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl WorkerCounters {
    #[inline]
    pub fn add(&self, counter: Counter, n: u64) {
        let c = &self.events[counter as usize];
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline]
    pub fn inc(&self, counter: Counter) {
        self.add(counter, 1);
    }

    #[inline]
    pub fn count_drop(&self, reason: DropReason) {
        let c = &self.drops[reason as usize];
        c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
    }

    /// Packets processed: the sum of the verdict counters (not counted separately, to keep
    /// one store off the per-packet path).
    pub fn packets(&self) -> u64 {
        [
            Counter::ToServer,
            Counter::ToClient,
            Counter::ToAllServers,
            Counter::Passed,
            Counter::Dropped,
        ]
        .iter()
        .map(|c| self.get(*c))
        .sum()
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.events[counter as usize].load(Relaxed)
    }

    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize].load(Relaxed)
    }

    /// Every non-zero drop counter.
    pub fn drop_counts(&self) -> Vec<(DropReason, u64)> {
        DropReason::ALL
            .iter()
            .map(|r| (*r, self.drops(*r)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}
