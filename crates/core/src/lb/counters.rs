//! Per-worker counters, written by one worker and read by the metrics endpoint.
//!
//! A counter is written only by its worker, so an increment is a relaxed load and store
//! (plain moves on x86), not a locked read-modify-write; readers on other threads see a
//! value that is at most a few packets old. Drops have one counter per reason.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::verdict::{DropReason, Verdict};

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
    FastPath => "fast_path", "Established packets (client segments and server replies) classified by the straight-line fast path.";
    CookiesInserted => "cookies_inserted", "Server packets whose TSval now carries a cookie.";
    OptionsFastPath => "options_fast_path", "Timestamp found by one wide compare (paper Table 1).";
    OptionsSlowPath => "options_slow_path", "TCP options that needed the TLV walk.";
    FallbackConnections => "fallback_connections", "SYNs without a timestamp, placed by Maglev and remembered in the fallback table.";
    FallbackHits => "fallback_hits", "Packets without a timestamp routed by the fallback table.";
    FallbackMisses => "fallback_misses", "Packets without a timestamp not in the fallback table, routed by Maglev.";
    FallbackLearnedFromServer => "fallback_learned_from_server", "SYN-ACKs without a timestamp that taught the fallback table the server.";
    FallbackEvictions => "fallback_evictions", "Connections forgotten by the fallback table to make room for another in their set.";
    MsbLearned => "ts_msb_learned", "A server's timestamp MSB seen for the first time.";
    MsbAdvanced => "ts_msb_advanced", "A server's timestamp MSB moved forward (one per 65.5 s at 1 ms ticks).";
    ServerTsClockUnstable => "server_ts_clock_unstable", "Server timestamps going backwards or ticking too fast to correct at the LB.";
    ServerTsAheadOfRealTime => "server_ts_ahead_of_real_time", "Server replies whose TSval was further ahead than real time allows since the server's clock was last anchored (a spoofed reply, or a clock that jumped): not learnt.";
    IcmpRoutedByCookie => "icmp_routed_by_cookie", "ICMP errors routed by the cookie of the embedded packet.";
    IcmpRoutedByFallback => "icmp_routed_by_fallback", "ICMP errors about a no-timestamp connection routed by the fallback table.";
    SynRetransmissions => "syn_retransmissions", "Retransmitted SYNs recognised: the count the SYN raised before is released.";
    HandshakeCountMoved => "handshake_count_moved", "SYN-ACKs of a server other than the last pick that passed first: the connection's count moved to that server.";
    ServerCloses => "server_closes", "Server FINs and RSTs counted as the close of a connection: the server's active count went down by one.";
    DuplicateCloses => "duplicate_closes", "Server FINs and RSTs of a close already counted (a retransmitted FIN, the RST after a FIN): not counted again.";
    ResetsWithoutTimestamp => "resets_without_timestamp", "Server RSTs without a timestamp option, never counted as closes: what Linux sends for a segment of a connection it does not know, e.g. a replayed one.";
    SnapshotReloads => "snapshot_reloads", "New table snapshots picked up by this worker.";
    LoadMerges => "load_merges", "Merges of this worker's load deltas into the shared totals.";
}

/// Sets of counters that the straight-line paths of `lb/fast_path.rs` always bump
/// together, stored as one word each: one store per packet instead of four. `get` adds a
/// bundle into every counter it stands for, so readers see exactly the counts they would
/// if each counter had been bumped; [`WorkerCounters::bundle`] tells how many packets took
/// each straight-line path (tests use it to check that those paths are exercised).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Bundle {
    /// An established client packet routed by its cookie.
    ClientCookie,
    /// An established client packet routed by a baseline's pick (hash or Maglev mode).
    ClientPick,
    /// A server reply whose TSval now carries a cookie.
    ServerCookie,
    /// A server reply in a baseline mode (no cookie).
    ServerPlain,
    /// A client SYN with its timestamp where Table 1 puts it, placed by the VIP's policy.
    /// The core counts such a SYN counter by counter on its general path; only the XDP
    /// program's in-kernel path counts it as a bundle (`STAT_FAST_CLIENT_SYN`).
    ClientSyn,
    /// [`ClientSyn`](Bundle::ClientSyn) for a SYN the handshake table recognised as
    /// retransmitted (`STAT_FAST_CLIENT_SYN_RETRANSMITTED`).
    ClientSynRetransmitted,
    /// A client segment without a timestamp option (no TCP options at all) routed by the
    /// shared fallback table. The core counts it counter by counter on its general path
    /// (the option walk finds no timestamp); only the XDP program's in-kernel path counts
    /// it as a bundle (`STAT_FAST_CLIENT_FALLBACK`).
    ClientFallback,
}

impl Bundle {
    pub const ALL: [Bundle; 7] = [
        Bundle::ClientCookie,
        Bundle::ClientPick,
        Bundle::ServerCookie,
        Bundle::ServerPlain,
        Bundle::ClientSyn,
        Bundle::ClientSynRetransmitted,
        Bundle::ClientFallback,
    ];
    const COUNT: usize = Self::ALL.len();

    /// The counters one packet of this bundle stands for.
    pub const fn counters(self) -> &'static [Counter] {
        match self {
            Bundle::ClientCookie => &[
                Counter::FastPath,
                Counter::OptionsFastPath,
                Counter::CookieRouted,
                Counter::ToServer,
            ],
            Bundle::ClientPick => &[Counter::FastPath, Counter::ToServer],
            Bundle::ServerCookie => &[
                Counter::FastPath,
                Counter::OptionsFastPath,
                Counter::CookiesInserted,
                Counter::ToClient,
            ],
            Bundle::ServerPlain => &[Counter::FastPath, Counter::ToClient],
            Bundle::ClientSyn => &[
                Counter::OptionsFastPath,
                Counter::NewConnections,
                Counter::ToServer,
            ],
            Bundle::ClientSynRetransmitted => &[
                Counter::OptionsFastPath,
                Counter::NewConnections,
                Counter::SynRetransmissions,
                Counter::ToServer,
            ],
            Bundle::ClientFallback => &[
                Counter::OptionsSlowPath,
                Counter::FallbackHits,
                Counter::ToServer,
            ],
        }
    }
}

/// One worker's counters, packed: the handful a packet bumps share one or two cache lines,
/// which only this worker writes. Fixed-size arrays, so an increment is a load and a
/// store at a constant offset, with no bounds check.
pub struct WorkerCounters {
    events: [AtomicU64; Counter::COUNT],
    bundles: [AtomicU64; Bundle::COUNT],
    drops: [AtomicU64; DropReason::COUNT],
}

impl Default for WorkerCounters {
    fn default() -> Self {
        WorkerCounters {
            events: std::array::from_fn(|_| AtomicU64::new(0)),
            bundles: std::array::from_fn(|_| AtomicU64::new(0)),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

impl WorkerCounters {
    #[inline]
    pub fn add(&self, counter: Counter, n: u64) {
        bump(&self.events[counter as usize], n);
    }

    #[inline]
    pub fn inc(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// One packet of a [`Bundle`]: every counter of the bundle, in one store.
    #[inline(always)]
    pub(crate) fn inc_bundle(&self, bundle: Bundle) {
        bump(&self.bundles[bundle as usize], 1);
    }

    #[inline]
    pub fn count_drop(&self, reason: DropReason) {
        bump(&self.drops[reason as usize], 1);
    }

    /// Counts a verdict under its counter (and a drop under its reason).
    #[inline(always)]
    pub(crate) fn count_verdict(&self, verdict: Verdict) {
        match verdict {
            Verdict::ToServer(_) => self.inc(Counter::ToServer),
            Verdict::ToClient => self.inc(Counter::ToClient),
            Verdict::ToAllServers { .. } => self.inc(Counter::ToAllServers),
            Verdict::Pass => self.inc(Counter::Passed),
            Verdict::Drop(reason) => {
                self.inc(Counter::Dropped);
                self.count_drop(reason);
            }
        }
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
        let bundled: u64 = Bundle::ALL
            .iter()
            .filter(|b| b.counters().contains(&counter))
            .map(|b| self.bundles[*b as usize].load(Relaxed))
            .fold(0, u64::wrapping_add);
        self.events[counter as usize]
            .load(Relaxed)
            .wrapping_add(bundled)
    }

    /// Packets counted as one `bundle` (each is also in every counter of the bundle).
    pub fn bundle(&self, bundle: Bundle) -> u64 {
        self.bundles[bundle as usize].load(Relaxed)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_counts_in_each_of_its_counters() {
        let counters = WorkerCounters::default();
        counters.inc(Counter::ToServer);
        counters.inc_bundle(Bundle::ClientCookie);
        counters.inc_bundle(Bundle::ClientCookie);
        counters.inc_bundle(Bundle::ServerPlain);
        assert_eq!(counters.get(Counter::ToServer), 3);
        assert_eq!(counters.get(Counter::CookieRouted), 2);
        assert_eq!(counters.get(Counter::OptionsFastPath), 2);
        assert_eq!(counters.get(Counter::FastPath), 3);
        assert_eq!(counters.get(Counter::ToClient), 1);
        assert_eq!(counters.get(Counter::CookiesInserted), 0);
        assert_eq!(counters.packets(), 4);
    }
}
