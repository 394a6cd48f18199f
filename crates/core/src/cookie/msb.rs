//! LB-side timestamp correction (paper appendix C.1), safe for many workers, restarts and
//! several LB instances.
//!
//! The cookie displaces the 16 MSB of the server's TSval; the client echoes the cookie in
//! TSecr, and the server must get back exactly the TSval it sent. The paper keeps, per
//! server, the current and previous MSB and a version bit toggled at each wrap. Here the
//! version bit is the *parity of the displaced MSB itself*, and each server has one shared
//! value M: the newest MSB seen from it. A TSecr with version v is restored to M when
//! `M = v (mod 2)`, else to `M - 1`. That needs no per-LB toggle state, so every worker, a
//! restarted LB that reloaded M, and another LB instance that learnt M from the same server
//! all restore the same value.
//!
//! Correct as long as an echo is never older than one MSB period (65.5 s at 1 ms ticks):
//! servers send at least every 25 s (TCP keepalive, appendix C), so M advances by at most
//! one between a TSval and its echo.
//!
//! While M is unknown (a fresh LB that has not yet seen a packet from the server and had
//! nothing persisted), [`MsbTable::restore`] returns `None` and the pipeline drops the
//! client packet as `ts_msb_unknown`. Guessing is worse than dropping: Linux takes TSecr
//! as an RTT sample, and a TSecr one period off is a 65 s sample that inflates the RTO. The
//! client retransmits, and any packet from the server (data, ACK, keepalive within 25 s)
//! teaches M.

use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

use super::tcp_ts::Unmasked;
use crate::types::{Nanos, ServerId, NANOS_PER_MS, NANOS_PER_SEC};

/// Set in a state once M is known; also in a restore entry once the MSB it holds is known.
const KNOWN: u32 = 1 << 16;
/// A server whose MSB advances more than once a minute has no millisecond-ish clock (e.g.
/// microsecond timestamps) or several clocks (`net.ipv4.tcp_timestamps=1` offsets every
/// address pair differently). At 1 ms ticks the MSB changes every 65.5 s.
///
/// The LB only sees a change when the server next sends, up to a keepalive later, so the
/// time between two observed changes says little. Instead, at each observed change, the
/// clock ticks elapsed since the previous one (TSval difference) are compared with the
/// real time elapsed: more than 65536 ticks a minute means more than one change a minute.
pub const MAX_TICKS_PER_MINUTE: u64 = 65_536;
/// Allowance for network delay between the two TSvals, in ticks.
const TICK_SLACK: u64 = 2_000;
const WARNING_INTERVAL: Nanos = 60 * NANOS_PER_SEC;
const UNKNOWN: u64 = u64::MAX;

/// What one server->client packet taught the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsbLearn {
    /// The MSB is M, or M - 1 (a packet reordered around a change): nothing to write.
    Unchanged,
    /// First MSB seen for this server.
    Learned,
    /// M moved forward.
    Advanced,
    /// The server's clock cannot be corrected LB-side; see [`ClockProblem`].
    Unstable(ClockProblem),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockProblem {
    /// The MSB went back by more than one step (several clocks, or a reboot).
    Backwards,
    /// The clock ticks faster than [`MAX_TICKS_PER_MINUTE`].
    TooFrequent,
}

struct ChangeLog {
    /// `(now in ms as u32) << 32 | TSval` at the last advance of M in this process, or
    /// `UNKNOWN`. One word, so the pair is always consistent.
    last_change: AtomicU64,
    last_warning: AtomicU64,
}

impl Default for ChangeLog {
    fn default() -> Self {
        ChangeLog {
            last_change: AtomicU64::new(UNKNOWN),
            last_warning: AtomicU64::new(0),
        }
    }
}

/// Per-server M, shared by all workers of an LB process.
///
/// Each M is kept twice: as the state that replies are checked against and that learning
/// moves (`states`), and as what each version of an echo is restored to (`restores`), so
/// that a client packet does no arithmetic on the version and no byte swap: it reads the
/// entry its unmasked cookie names and writes those two bytes into the packet. M changes
/// about once a minute per server; every change rewrites the server's two entries.
pub struct MsbTable {
    /// `KNOWN | M` per server id; the word a reply reads. Sized to the whole id space, so
    /// an id decoded from a cookie (15 bits) needs no bounds check.
    states: Box<[AtomicU32; ServerId::SPACE]>,
    /// Indexed by [`Unmasked`] (`version << 15 | id`): `KNOWN | the restored MSB in network
    /// byte order` (the value whose in-memory bytes are the packet's), 0 while M is
    /// unknown. Always `restore_entry` of the server's state once its writers are done
    /// (see [`MsbTable::publish`]).
    restores: Box<[AtomicU32; 2 * ServerId::SPACE]>,
    changes: Box<[ChangeLog]>,
    /// Bumped on every write of an M, so a persister knows when to save.
    writes: AtomicU64,
}

impl Default for MsbTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MsbTable {
    pub fn new() -> Self {
        MsbTable {
            states: zeroed_words(),
            restores: zeroed_words(),
            changes: (0..ServerId::SPACE).map(|_| ChangeLog::default()).collect(),
            writes: AtomicU64::new(0),
        }
    }

    /// Records the TSval that `server` sent (its MSB, and at changes its tick rate).
    #[inline(always)]
    pub fn learn(&self, server: ServerId, tsval: u32, now: Nanos) -> MsbLearn {
        let msb = (tsval >> 16) as u16;
        let current = self.states[server.index()].load(Relaxed);
        if current == KNOWN | msb as u32 || current == KNOWN | msb.wrapping_add(1) as u32 {
            return MsbLearn::Unchanged;
        }
        self.learn_slow(server, tsval, now, current)
    }

    #[cold]
    fn learn_slow(&self, server: ServerId, tsval: u32, now: Nanos, mut current: u32) -> MsbLearn {
        let msb = (tsval >> 16) as u16;
        let state = &self.states[server.index()];
        loop {
            if current & KNOWN != 0 {
                let step = msb.wrapping_sub(current as u16) as i16;
                if step == 0 || step == -1 {
                    return MsbLearn::Unchanged;
                }
                if step < 0 {
                    return self.unstable(
                        server,
                        ClockProblem::Backwards,
                        msb,
                        current as u16,
                        now,
                    );
                }
            }
            // SeqCst: `publish` relies on one total order of state writes and its own loads.
            match state.compare_exchange_weak(current, KNOWN | msb as u32, SeqCst, Relaxed) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.publish(server);
        self.writes.fetch_add(1, Relaxed);
        if current & KNOWN == 0 {
            return MsbLearn::Learned;
        }
        let now_ms = (now / NANOS_PER_MS) as u32;
        let previous = self.changes[server.index()]
            .last_change
            .swap(((now_ms as u64) << 32) | tsval as u64, Relaxed);
        if previous != UNKNOWN {
            let real_ms = now_ms.wrapping_sub((previous >> 32) as u32) as u64;
            let ticks = tsval.wrapping_sub(previous as u32) as u64;
            if ticks > real_ms * MAX_TICKS_PER_MINUTE / 60_000 + TICK_SLACK {
                return self.unstable(server, ClockProblem::TooFrequent, msb, current as u16, now);
            }
        }
        MsbLearn::Advanced
    }

    fn unstable(
        &self,
        server: ServerId,
        problem: ClockProblem,
        msb: u16,
        m: u16,
        now: Nanos,
    ) -> MsbLearn {
        let last = &self.changes[server.index()].last_warning;
        let previous = last.load(Relaxed);
        if (previous == 0 || now.saturating_sub(previous) >= WARNING_INTERVAL)
            && last
                .compare_exchange(previous, now.max(1), Relaxed, Relaxed)
                .is_ok()
        {
            tracing::warn!(
                server = server.0,
                ?problem,
                msb,
                remembered = m,
                "server {server}'s TCP timestamp clock cannot be corrected by the LB: run it with \
                 `sysctl -w net.ipv4.tcp_timestamps=2` (one clock per host, millisecond ticks) \
                 or use server-side timestamp correction"
            );
        }
        MsbLearn::Unstable(problem)
    }

    /// The original MSB for an echoed cookie of `version`, or `None` while M is unknown.
    #[inline]
    pub fn restore(&self, server: ServerId, version: u16) -> Option<u16> {
        self.restore_unmasked(Unmasked::new(server, version))
            .map(u16::from_be)
    }

    /// [`restore`](MsbTable::restore) for an unmasked cookie, in network byte order: the
    /// `u16` whose bytes in memory are the two the packet must carry (`u16::from_be` gives
    /// the MSB itself). One load: this is what a client packet pays for the restore.
    #[inline(always)]
    pub fn restore_unmasked(&self, cookie: Unmasked) -> Option<u16> {
        let entry = self.restores[cookie.0 as usize].load(Relaxed);
        (entry & KNOWN != 0).then_some(entry as u16)
    }

    /// Rewrites `server`'s two restore entries from its state, after every write of the
    /// state. Two writers can publish at once (two workers seeing successive MSBs, or a
    /// worker and an import), and the one that read the older state may store last; so
    /// each writer reads the state again after its stores and goes round until the state
    /// it published is still the state. With every access here and every state write
    /// SeqCst, the last stores to the entries are then always of the last state. Costs a
    /// few fenced stores once a minute per server.
    fn publish(&self, server: ServerId) {
        let state = &self.states[server.index()];
        let mut published = state.load(SeqCst);
        loop {
            for version in 0..2 {
                let at = Unmasked::new(server, version).0 as usize;
                self.restores[at].store(restore_entry(published, version), SeqCst);
            }
            let now = state.load(SeqCst);
            if now == published {
                return;
            }
            published = now;
        }
    }

    pub fn get(&self, server: ServerId) -> Option<u16> {
        let current = self.states[server.index()].load(Relaxed);
        (current & KNOWN != 0).then_some(current as u16)
    }

    /// Forgets a server (its id was retired or is being reused by another host).
    pub fn forget(&self, server: ServerId) {
        self.states[server.index()].store(0, SeqCst);
        self.publish(server);
        self.changes[server.index()]
            .last_change
            .store(UNKNOWN, Relaxed);
        self.writes.fetch_add(1, Relaxed);
    }

    /// Number of writes so far; a persister saves when this moved.
    pub fn write_count(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    /// Every known M, for persisting across a restart.
    pub fn export(&self) -> Vec<(ServerId, u16)> {
        (0..ServerId::SPACE)
            .filter_map(|i| {
                let id = ServerId(i as u16);
                self.get(id).map(|m| (id, m))
            })
            .collect()
    }

    /// Loads persisted values. They are only as fresh as the persisted file: the caller
    /// must not import values older than one MSB period.
    pub fn import(&self, values: &[(ServerId, u16)]) {
        for &(server, m) in values {
            self.states[server.index()].store(KNOWN | m as u32, SeqCst);
            self.publish(server);
        }
        self.writes.fetch_add(1, Relaxed);
    }
}

/// What an echo of `version` is restored to under `state` (`KNOWN | M`, or 0): M itself when
/// its parity is the version's, else M - 1; as a [`MsbTable::restore_unmasked`] entry.
fn restore_entry(state: u32, version: u16) -> u32 {
    if state & KNOWN == 0 {
        return 0;
    }
    let m = state as u16;
    KNOWN | m.wrapping_sub((m ^ version) & 1).to_be() as u32
}

/// `N` atomic words, 0, on the heap (atomics are not `Clone`, so not `boxed_array`).
fn zeroed_words<const N: usize>() -> Box<[AtomicU32; N]> {
    (0..N)
        .map(|_| AtomicU32::new(0))
        .collect::<Box<[_]>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("N words were made"))
}

/// How old a persisted M may be and still be trusted: an echo may lag a TSval by up to a
/// keepalive (25 s), and M must be within one step of every MSB still in flight. A file
/// older than this may be a step or more behind; re-learning from traffic is safer.
pub const MAX_PERSISTED_AGE_MS: u64 = 30_000;

/// What the daemon writes to disk so M survives a restart (any serde format).
///
/// `saved_at_unix_ms` means "M was current at this time", so the daemon saves whenever
/// [`MsbTable::write_count`] moves *and* at least every few seconds without changes;
/// otherwise a restart more than 30 s after the last change would discard a valid M.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PersistedMsb {
    /// Wall-clock time of the save, in ms since the Unix epoch (passed in by the daemon).
    pub saved_at_unix_ms: u64,
    /// (server id, M) for every server whose M is known.
    pub servers: Vec<(u16, u16)>,
}

/// Why persisted values were not loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistedMsbError {
    /// Saved longer ago than [`MAX_PERSISTED_AGE_MS`] (or in the future).
    Stale { age_ms: i64 },
    /// A server id above the cookie's range.
    BadServerId(u16),
}

impl std::fmt::Display for PersistedMsbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PersistedMsbError::Stale { age_ms } => write!(
                f,
                "saved {age_ms} ms ago, more than {MAX_PERSISTED_AGE_MS} ms: each server's timestamp MSB will be re-learnt from its next packet"
            ),
            PersistedMsbError::BadServerId(id) => write!(f, "server id {id} is above {}", ServerId::MAX),
        }
    }
}

impl MsbTable {
    pub fn persist(&self, now_unix_ms: u64) -> PersistedMsb {
        PersistedMsb {
            saved_at_unix_ms: now_unix_ms,
            servers: self.export().into_iter().map(|(id, m)| (id.0, m)).collect(),
        }
    }

    /// Loads a persisted table if it is fresh enough; returns how many servers it knew.
    pub fn load_persisted(
        &self,
        saved: &PersistedMsb,
        now_unix_ms: u64,
    ) -> Result<usize, PersistedMsbError> {
        let age_ms = now_unix_ms as i64 - saved.saved_at_unix_ms as i64;
        if !(0..=MAX_PERSISTED_AGE_MS as i64).contains(&age_ms) {
            return Err(PersistedMsbError::Stale { age_ms });
        }
        let values = saved
            .servers
            .iter()
            .map(|&(id, m)| {
                ServerId::new(id)
                    .map(|id| (id, m))
                    .ok_or(PersistedMsbError::BadServerId(id))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.import(&values);
        Ok(values.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cookie::tcp_ts;
    use proptest::prelude::*;

    const A: ServerId = ServerId(3);

    #[test]
    fn unknown_until_learnt_then_restores_both_versions() {
        let t = MsbTable::new();
        assert_eq!(t.restore(A, 0), None);
        assert_eq!(t.learn(A, 0x1235_0000, 1), MsbLearn::Learned);
        assert_eq!(t.restore(A, 1), Some(0x1235));
        assert_eq!(t.restore(A, 0), Some(0x1234));
    }

    /// Both restore entries of `server` as `restore_entry` derives them from its state.
    fn assert_entries_follow_the_state(t: &MsbTable, server: ServerId) {
        let state = t.states[server.index()].load(Relaxed);
        for version in 0..2 {
            let unmasked = Unmasked::new(server, version);
            assert_eq!(
                t.restores[unmasked.0 as usize].load(Relaxed),
                restore_entry(state, version),
                "server {server}, version {version}, state {state:#x}"
            );
        }
    }

    #[test]
    fn restore_entries_follow_every_write_of_m() {
        let t = MsbTable::new();
        let b = ServerId(ServerId::MAX);
        assert_eq!(t.restore_unmasked(Unmasked::new(A, 1)), None);
        t.learn(A, 0xfffe_0000, 1);
        t.learn(b, 0x0041_0000, 1);
        assert_entries_follow_the_state(&t, A);
        assert_eq!(
            t.restore_unmasked(Unmasked::new(A, 0)),
            Some(0xfffe_u16.to_be())
        );
        assert_eq!(
            t.restore_unmasked(Unmasked::new(A, 1)),
            Some(0xfffd_u16.to_be())
        );
        // Across the wrap of the MSB itself.
        t.learn(A, 0xffff_0000, 66 * NANOS_PER_SEC);
        t.learn(A, 0x0000_0001, 132 * NANOS_PER_SEC);
        assert_entries_follow_the_state(&t, A);
        assert_eq!(t.restore(A, 1), Some(0xffff));
        assert_eq!(t.restore(A, 0), Some(0x0000));
        t.forget(A);
        assert_entries_follow_the_state(&t, A);
        assert_eq!(t.restore(A, 0), None);
        assert_eq!(t.restore(A, 1), None);
        // Forgetting one server leaves the others alone.
        assert_eq!(t.restore(b, 1), Some(0x41));
        t.import(&[(A, 0x0200)]);
        assert_entries_follow_the_state(&t, A);
        assert_eq!(t.restore(A, 1), Some(0x01ff));
    }

    /// Workers that see successive MSBs at the same moment race to publish; whoever stores
    /// last, the entries end as the final state says.
    #[test]
    fn racing_writers_leave_the_entries_of_the_last_state() {
        // A lost race shows only now and then: a publish without its second look at the
        // state failed 3 runs of 5 with one round, 5 of 6 with ten; so thirty rounds.
        for _ in 0..30 {
            let t = MsbTable::new();
            let servers: Vec<ServerId> = (0..4).map(|i| ServerId(i * 1000 + 1)).collect();
            std::thread::scope(|scope| {
                for worker in 0..4u32 {
                    let (t, servers) = (&t, &servers);
                    scope.spawn(move || {
                        for step in 0..20_000u32 {
                            for (i, &server) in servers.iter().enumerate() {
                                // Each worker sees the clock a little behind or ahead of the
                                // others.
                                let msb = (step + (worker + i as u32) % 3) & 0xffff;
                                t.learn(server, msb << 16, step as u64 * NANOS_PER_MS);
                            }
                        }
                    });
                }
            });
            for &server in &servers {
                assert_entries_follow_the_state(&t, server);
                assert!(t.get(server).is_some());
            }
        }
    }

    #[test]
    fn reordered_packet_one_step_behind_changes_nothing() {
        let t = MsbTable::new();
        t.learn(A, 10 << 16, 1);
        assert_eq!(t.learn(A, 9 << 16 | 0xfff0, 2), MsbLearn::Unchanged);
        assert_eq!(t.get(A), Some(10));
    }

    #[test]
    fn wrap_of_the_msb_itself_is_a_forward_step() {
        let t = MsbTable::new();
        t.learn(A, 0xffff_0000, 1);
        assert_eq!(
            t.learn(A, 0x0000_0010, 66 * NANOS_PER_SEC),
            MsbLearn::Advanced
        );
        assert_eq!(t.restore(A, 1), Some(0xffff));
        assert_eq!(t.restore(A, 0), Some(0x0000));
    }

    #[test]
    fn backwards_clock_is_flagged_and_never_overwrites_m() {
        let t = MsbTable::new();
        t.learn(A, 100 << 16, 1);
        assert_eq!(
            t.learn(A, 50 << 16, 2),
            MsbLearn::Unstable(ClockProblem::Backwards)
        );
        assert_eq!(t.get(A), Some(100));
    }

    #[test]
    fn microsecond_clock_is_flagged_and_millisecond_clock_is_not() {
        // Microseconds: the MSB moves every 65.5 ms.
        let us = MsbTable::new();
        let mut flagged = false;
        for step in 0..5u64 {
            let now = step * 66 * NANOS_PER_MS;
            flagged |= us.learn(A, (now / 1_000) as u32, now)
                == MsbLearn::Unstable(ClockProblem::TooFrequent);
        }
        assert!(flagged);
        // Milliseconds seen sparsely (a packet every 25 s): changes are observed as little as
        // 40 s apart, which must not be mistaken for a fast clock.
        let ms = MsbTable::new();
        for step in 0..40u64 {
            let now = step * 25 * NANOS_PER_SEC + (step % 3) * 7 * NANOS_PER_SEC;
            let learnt = ms.learn(A, (now / NANOS_PER_MS) as u32 + 12_345, now);
            assert!(
                !matches!(learnt, MsbLearn::Unstable(_)),
                "{learnt:?} at step {step}"
            );
        }
    }

    #[test]
    fn export_import_survives_a_restart() {
        let t = MsbTable::new();
        t.learn(A, 77 << 16, 1);
        t.learn(ServerId(9), 5 << 16, 1);
        let saved = t.export();
        let restarted = MsbTable::new();
        restarted.import(&saved);
        assert_eq!(restarted.restore(A, 0), Some(76));
        assert_eq!(restarted.get(ServerId(9)), Some(5));
        assert!(restarted.write_count() > 0);
        // The first change after a restart is not judged against a pre-restart time.
        assert_eq!(restarted.learn(A, 78 << 16, 5), MsbLearn::Advanced);
    }

    #[test]
    fn persisted_values_load_only_while_fresh() {
        let t = MsbTable::new();
        t.learn(A, 0x0102_0000, 1);
        let saved = t.persist(1_000_000);
        let text = toml::to_string(&saved).unwrap();
        let back: PersistedMsb = toml::from_str(&text).unwrap();
        let fresh = MsbTable::new();
        assert_eq!(
            fresh.load_persisted(&back, 1_000_000 + MAX_PERSISTED_AGE_MS),
            Ok(1)
        );
        assert_eq!(fresh.get(A), Some(0x0102));
        let late = MsbTable::new();
        assert_eq!(
            late.load_persisted(&back, 1_000_000 + MAX_PERSISTED_AGE_MS + 1),
            Err(PersistedMsbError::Stale { age_ms: 30_001 })
        );
        assert_eq!(late.get(A), None);
        let bad = PersistedMsb {
            saved_at_unix_ms: 5,
            servers: vec![(40_000, 1)],
        };
        assert_eq!(
            late.load_persisted(&bad, 5),
            Err(PersistedMsbError::BadServerId(40_000))
        );
    }

    /// One server clock in milliseconds with its own offset.
    #[derive(Debug, Clone)]
    struct ServerClock {
        id: ServerId,
        offset_ms: u32,
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// Server sends a TSval (through LB worker `worker`) at this time; the client echoes
        /// it `echo_delay_ms` later through worker `echo_worker`.
        Send {
            server: usize,
            worker: usize,
            echo_delay_ms: u64,
            echo_worker: usize,
        },
    }

    fn scenario() -> impl Strategy<Value = (Vec<u32>, Vec<(u64, Event)>)> {
        // Two servers whose clocks sit (about) a wrap apart, plus a random one.
        let offsets = (any::<u32>(), any::<u32>())
            .prop_map(|(base, other)| vec![base, base.wrapping_add(65_536), other]);
        // Sends at most 25 s apart per server (keepalive), over at least 3 MSB periods.
        let sends = proptest::collection::vec(
            (0usize..3, 1u64..25_000, 0usize..2, 0u64..30_000, 0usize..2),
            60..160,
        );
        (offsets, sends).prop_map(|(offsets, sends)| {
            let mut next = [0u64; 3];
            let mut events = Vec::new();
            for (server, gap, worker, delay, echo_worker) in sends {
                next[server] += gap;
                events.push((
                    next[server],
                    Event::Send {
                        server,
                        worker,
                        echo_delay_ms: delay,
                        echo_worker,
                    },
                ));
            }
            // Keep every server alive across >= 3 wraps (3 * 65.5 s) with 25 s keepalives.
            for (server, last) in next.iter_mut().enumerate() {
                while *last < 3 * 65_536 + 1_000 {
                    *last += 25_000;
                    events.push((
                        *last,
                        Event::Send {
                            server,
                            worker: server % 2,
                            echo_delay_ms: 30_000,
                            echo_worker: 1 - server % 2,
                        },
                    ));
                }
            }
            events.sort_by_key(|e| e.0);
            (offsets, events)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every restored TSecr equals the TSval the server sent: server clocks a wrap
        /// apart, echoes delayed up to 30 s, two workers sharing the table, >= 3 wraps.
        #[test]
        fn every_restored_tsecr_is_what_the_server_sent((offsets, events) in scenario(), hash in any::<u64>()) {
            let table = MsbTable::new();
            let servers: Vec<_> = offsets.iter().enumerate()
                .map(|(i, &offset_ms)| ServerClock { id: ServerId(i as u16 * 1000 + 7), offset_ms })
                .collect();
            // Two workers share one table; each holds its own handle (a reference here).
            let workers = [&table, &table];
            // Pending echoes: (arrival ms, worker, server index, cookie-carrying TSecr, original TSval).
            let mut echoes: Vec<(u64, usize, usize, u32, u32)> = Vec::new();
            let mut restored = 0;
            for (at_ms, event) in &events {
                echoes.sort_by_key(|e| e.0);
                while echoes.first().is_some_and(|e| e.0 <= *at_ms) {
                    let (_, w, s, tsecr, original) = echoes.remove(0);
                    let decoded = tcp_ts::decode(tcp_ts::extract(tsecr), hash);
                    prop_assert_eq!(decoded.server, servers[s].id);
                    let msb = workers[w].restore(decoded.server, decoded.version).expect("M known");
                    prop_assert_eq!(((msb as u32) << 16) | (tsecr & 0xffff), original);
                    restored += 1;
                }
                let Event::Send { server, worker, echo_delay_ms, echo_worker } = *event;
                let clock = &servers[server];
                let tsval = clock.offset_ms.wrapping_add(*at_ms as u32);
                let msb = (tsval >> 16) as u16;
                let learnt = workers[worker].learn(clock.id, tsval, at_ms * NANOS_PER_MS);
                prop_assert!(!matches!(learnt, MsbLearn::Unstable(_)), "{:?}", learnt);
                let cookie = tcp_ts::encode(clock.id, hash, msb);
                echoes.push((at_ms + echo_delay_ms, echo_worker, server, tcp_ts::insert(tsval, cookie), tsval));
            }
            prop_assert!(restored > 50);
        }
    }
}
