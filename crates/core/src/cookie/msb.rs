//! LB-side timestamp correction (paper appendix C.1), safe for many workers, restarts,
//! several LB instances and connections that stay idle for minutes.
//!
//! The cookie displaces the 16 MSB of the server's TSval and keeps only their low k bits
//! (the epoch, [`super::tcp_ts`]); the server must get back exactly the TSval it sent. For
//! each server the table keeps M^, an estimate of the server's MSB *now*: the last TSval
//! learnt from it plus the LB time elapsed since (so a quiet server, or one whose replies
//! went through another LB instance, does not make it stale). An echo of epoch e is
//! restored to the newest MSB `<= M^ + 1` that is e modulo 2^k. That is exact for every
//! echo up to 2^k - 2 periods older than M^ (14 periods, 15 minutes, at k = 4), with M^ up
//! to a period behind the server; far more than the 2^(k-1) periods a client's PAWS check
//! lets a connection idle (docs/timestamps.md). Every worker, a restarted LB that reloaded
//! its estimates, and another instance that learnt the same server restore the same value.
//!
//! Not assumed, unlike the paper's appendix C: that servers send at least once a period.
//! A server's keepalive probe (seq = SND.UNA - 1) never refreshes a client's TS.Recent, so
//! after an idle gap the client echoes a TSval as old as the gap, and the server's next
//! segment is judged against it.
//!
//! While a server's clock is unknown (a fresh LB that has not yet seen a packet from it and
//! had nothing persisted), [`MsbTable::restore`] returns `None` and the pipeline drops the
//! client packet as `ts_msb_unknown`. Guessing is worse than dropping: Linux takes TSecr as
//! an RTT sample, and a TSecr periods off inflates the RTO. The client retransmits, and the
//! server's next reply, or this instance's next health probe, teaches the clock.
//!
//! Two sources teach a clock, and only one is trusted. A reply ([`MsbTable::learn`]) may
//! only move the estimate forward, and no further than real time allows since the clock
//! was last anchored by a probe (or, never probed, by a reply): so no packet, nor a train of
//! packets each a little ahead, can push M^ ahead of the server, whoever sends them. The
//! SYN-ACK answering this instance's own probe ([`MsbTable::learn_probe`]) anchors the clock
//! wherever it is, backwards too: a server that rebooted restarts its clock near 0, and its
//! new connections are restored right from the next probe on.

use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

use super::tcp_ts::{CookieLayout, Unmasked};
use crate::types::{Nanos, ServerId, NANOS_PER_MS, NANOS_PER_SEC};
use crate::words::Words;

/// Set in a state once it is known; also in a restore entry once the MSB it holds is known.
/// Public because the XDP program reads the same words (`MSB_KNOWN` in
/// bpf/include/cheetah_shared.h).
pub const KNOWN: u32 = 1 << 16;
/// The high bits of an estimate word count the writes that may move M^ anywhere (a probe,
/// an import, a forget). A writer that computed M^ from what it read earlier (a reply being
/// learnt, the refresh) writes only if the generation is still the one it read first, so
/// it can never put back what such a write replaced.
/// Public, as the constants below, because the XDP program learns replies by the same
/// rules (`MSB_*` in bpf/include/cheetah_shared.h).
pub const GENERATION_ONE: u32 = 1 << 17;
const GENERATION: u32 = !(GENERATION_ONE - 1);
/// Set in a restore entry whose echo is certainly older than the layout's idle limit: the
/// server's next segment may be dropped by the client's PAWS check. Counted, not dropped.
/// Public for the XDP program, which leaves such an echo to userspace so it is counted
/// (`MSB_BEYOND_IDLE_LIMIT` in bpf/include/cheetah_shared.h).
pub const BEYOND_IDLE_LIMIT: u32 = 1 << 17;
/// A server whose MSB advances more than once a minute has no millisecond-ish clock (e.g.
/// microsecond timestamps) or several clocks (`net.ipv4.tcp_timestamps=1` offsets every
/// address pair differently). At 1 ms ticks the MSB changes every 65.5 s.
///
/// The LB only sees a change when the server next sends, so the time between two observed
/// changes says little. Instead, at each observed change, the clock ticks elapsed since
/// the previous one (TSval difference) are compared with the real time elapsed: more than
/// 65536 ticks a minute means more than one change a minute.
pub const MAX_TICKS_PER_MINUTE: u64 = 65_536;
/// Allowance for network delay between the two TSvals, in ticks: how far a reply may be
/// ahead of real time since the anchor it is bounded by (the anchor's own delay, the LB's
/// batch clock, a server tick coarser than 1 ms).
pub const TICK_SLACK: u64 = 2_000;
/// The estimate runs this much slower than the LB's clock (1/2048, about 490 ppm), so that
/// a server clock that is a little slow does not put M^ ahead of the server: behind is what
/// the restore window absorbs best. Linux's TCP clock is the host's monotonic clock,
/// which NTP keeps within tens of ppm of the LB's.
pub const DRIFT_ALLOWANCE_SHIFT: u32 = 11;
/// Anchors older than this are moved forward to their estimate by [`MsbTable::refresh`],
/// so the 32-bit ms arithmetic of the estimate never wraps (it would after 24.8 days).
const REANCHOR_AFTER_MS: u32 = 3_600_000;
const WARNING_INTERVAL: Nanos = 60 * NANOS_PER_SEC;
/// An anchor or limit word that holds none.
pub const UNKNOWN: u64 = u64::MAX;
const ID_SPACE: usize = ServerId::SPACE;
/// Unmasked cookies, the index space of the restore entries.
pub const COOKIES: usize = 1 << 16;

/// What one server->client packet (or probe answer) taught the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsbLearn {
    /// The MSB is the newest seen, or one before (a packet reordered around a change).
    Unchanged,
    /// First MSB seen for this server.
    Learned,
    /// The server's MSB moved forward.
    Advanced,
    /// A probe answer moved the server's clock backwards, or forward further than real time
    /// allows (the server rebooted, or its clock was stepped): every restore entry was
    /// republished from it. Only [`MsbTable::learn_probe`] says this.
    Reset,
    /// The reply was not learnt, or the server's clock cannot be corrected LB-side; see
    /// [`ClockProblem`].
    Unstable(ClockProblem),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockProblem {
    /// The MSB went back by more than one step (several clocks, or a reboot): not learnt.
    Backwards,
    /// The clock ticks faster than [`MAX_TICKS_PER_MINUTE`].
    TooFrequent,
    /// The TSval is further ahead than real time allows since the server's clock was last
    /// anchored (a spoofed reply, or a clock that jumped; the next probe re-anchors a clock
    /// that really jumped): not learnt.
    AheadOfRealTime,
}

/// Per-server clock estimates, shared by all workers of an LB process.
///
/// Each server has three words: the newest MSB seen from it (what replies are compared
/// with), the anchor of its estimate (a TSval and the LB time it was seen), and M^, the
/// estimate the restore entries were last computed from. A client packet reads none of
/// them: it reads the entry its unmasked cookie names (`epoch << (16 - k) | id`), which
/// holds the restored MSB in network byte order, and writes those two bytes into the
/// packet. M^ moves about once a minute per server; every move rewrites the server's 2^k
/// entries.
pub struct MsbTable {
    layout: CookieLayout,
    /// `KNOWN | newest MSB seen` per server id. Sized to the whole id space, so an id
    /// decoded from a cookie needs no bounds check.
    seen: SharedWords<ID_SPACE>,
    /// The words only the clock's writers read (anchors, bounds, estimates): the core's
    /// own, or the XDP program's, which learns replies in the kernel.
    clock: Words<ClockWords>,
    /// Indexed by [`Unmasked`]: `KNOWN | BEYOND_IDLE_LIMIT? | the restored MSB in network
    /// byte order` (the value whose in-memory bytes are the packet's), 0 while the clock is
    /// unknown. Always `restore_entry` of the server's estimate once its writers are done
    /// (see [`MsbTable::publish`]).
    restores: SharedWords<COOKIES>,
    last_warning: Box<[AtomicU64; ID_SPACE]>,
    echoes_beyond_idle_limit: AtomicU64,
    probe_resets: AtomicU64,
}

impl Default for MsbTable {
    fn default() -> Self {
        Self::new(CookieLayout::default())
    }
}

impl MsbTable {
    pub fn new(layout: CookieLayout) -> Self {
        Self::with_words(
            layout,
            SharedWords::zeroed(),
            SharedWords::zeroed(),
            ClockWords::owned(),
        )
    }

    /// A table whose words are the caller's: e.g. the XDP program's mmapped arrays, so
    /// that the kernel's fast path and the workers share one clock table: `seen` and
    /// `restores` (the two a packet path reads) and `clock` (what learning a reply
    /// writes, which the kernel does too). The words are cleared: a table starts knowing
    /// no clock.
    pub fn with_words(
        layout: CookieLayout,
        seen: SharedWords<ID_SPACE>,
        restores: SharedWords<COOKIES>,
        clock: Words<ClockWords>,
    ) -> Self {
        for word in seen.iter().chain(restores.iter()) {
            word.store(0, SeqCst);
        }
        Self::with_kept_words(layout, seen, restores, clock)
    }

    /// [`with_words`](Self::with_words) over words an earlier process filled (pinned
    /// maps): the kernel goes on restoring with `seen` and `restores`, while this table
    /// knows no clock until the caller imports [`kept_clocks`](Self::kept_clocks) (with
    /// [`import_newer`](Self::import_newer), after any other import). The learning words
    /// (`clock`) start cleared: their anchors are in the earlier run's milliseconds, and
    /// an import anchors each clock afresh anyway.
    pub fn with_kept_words(
        layout: CookieLayout,
        seen: SharedWords<ID_SPACE>,
        restores: SharedWords<COOKIES>,
        clock: Words<ClockWords>,
    ) -> Self {
        clock[0].clear();
        MsbTable {
            layout,
            seen,
            clock,
            restores,
            last_warning: atomics(|| AtomicU64::new(0)),
            echoes_beyond_idle_limit: AtomicU64::new(0),
            probe_resets: AtomicU64::new(0),
        }
    }

    /// The words learning writes (one table's, whoever owns them).
    #[inline(always)]
    fn clock(&self) -> &ClockWords {
        &self.clock[0]
    }

    pub fn layout(&self) -> CookieLayout {
        self.layout
    }

    /// Records the TSval of a reply `server` sent (its MSB, and at changes its tick rate).
    /// Never moves the estimate backwards, nor further forward than real time allows since
    /// the server's clock was last anchored: such a reply is not learnt.
    #[inline(always)]
    pub fn learn(&self, server: ServerId, tsval: u32, now: Nanos) -> MsbLearn {
        let msb = (tsval >> 16) as u16;
        let current = self.seen[server.index()].load(Relaxed);
        if current == KNOWN | msb as u32 || current == KNOWN | msb.wrapping_add(1) as u32 {
            return MsbLearn::Unchanged;
        }
        self.learn_slow(server, tsval, now, current)
    }

    /// A reply whose MSB is not the newest seen. Every word it writes is written by a
    /// compare-exchange against what it read before its bound check (and the estimate
    /// against the generation it read first), in the reverse of the order `learn_probe`
    /// writes them: so a probe answer racing it either overwrites its writes or makes them
    /// fail, and a reply from before a reboot cannot undo the probe's reset.
    #[cold]
    fn learn_slow(&self, server: ServerId, tsval: u32, now: Nanos, mut current: u32) -> MsbLearn {
        let index = server.index();
        let msb = (tsval >> 16) as u16;
        let now_ms = millis(now);
        let generation = self.clock().estimates[index].load(SeqCst) & GENERATION;
        let previous = self.clock().anchors[index].load(SeqCst);
        let seen = &self.seen[index];
        let mut limit;
        loop {
            limit = self.clock().limits[index].load(SeqCst);
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
                if limit != UNKNOWN && ahead_of_real_time(limit, tsval, now_ms) {
                    let problem = ClockProblem::AheadOfRealTime;
                    return self.unstable(server, problem, msb, current as u16, now);
                }
            }
            match seen.compare_exchange_weak(current, KNOWN | msb as u32, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        let here = anchor(now_ms, tsval);
        // A failed exchange means a newer anchor (a probe's, another reply's): keep it.
        let _ = self.clock().anchors[index].compare_exchange(previous, here, SeqCst, Relaxed);
        if !self.clock().probed[index].load(SeqCst) {
            let _ = self.clock().limits[index].compare_exchange(limit, here, SeqCst, Relaxed);
        }
        // Anchored just now, the estimate is the MSB the server sent.
        self.raise_estimate(server, msb, generation, false);
        self.clock().writes.fetch_add(1, Relaxed);
        if current & KNOWN == 0 {
            return MsbLearn::Learned;
        }
        if previous != UNKNOWN {
            let real_ms = now_ms.wrapping_sub((previous >> 32) as u32) as u64;
            let ticks = tsval.wrapping_sub(previous as u32) as u64;
            if ticks > real_ms * MAX_TICKS_PER_MINUTE / 60_000 + TICK_SLACK {
                return self.unstable(server, ClockProblem::TooFrequent, msb, current as u16, now);
            }
        }
        MsbLearn::Advanced
    }

    /// Records the TSval of the SYN-ACK answering this instance's own health probe of
    /// `server`. Trusted: it anchors the server's clock where it is, backwards or far ahead
    /// too (then every restore entry is republished from it, [`MsbLearn::Reset`]), bounds
    /// the replies learnt from then on, and marks the clock [`probed`](MsbTable::probed).
    pub fn learn_probe(&self, server: ServerId, tsval: u32, now: Nanos) -> MsbLearn {
        let index = server.index();
        let msb = (tsval >> 16) as u16;
        let now_ms = millis(now);
        let current = self.seen[index].load(SeqCst);
        let bound = match self.clock().limits[index].load(SeqCst) {
            UNKNOWN => self.clock().anchors[index].load(SeqCst),
            limit => limit,
        };
        let learnt = if current & KNOWN == 0 {
            MsbLearn::Learned
        } else {
            match msb.wrapping_sub(current as u16) as i16 {
                0 | -1 => MsbLearn::Unchanged,
                step if step < 0 => MsbLearn::Reset,
                _ if bound != UNKNOWN && ahead_of_real_time(bound, tsval, now_ms) => {
                    MsbLearn::Reset
                }
                _ => MsbLearn::Advanced,
            }
        };
        // The order `learn_slow` relies on: the bound first, the estimate last.
        let here = anchor(now_ms, tsval);
        self.clock().probed[index].store(true, SeqCst);
        self.clock().limits[index].store(here, SeqCst);
        self.clock().anchors[index].store(here, SeqCst);
        if learnt == MsbLearn::Unchanged {
            return learnt;
        }
        self.seen[index].store(KNOWN | msb as u32, SeqCst);
        self.set_estimate(server, KNOWN | msb as u32);
        if learnt == MsbLearn::Reset {
            self.probe_resets.fetch_add(1, Relaxed);
            self.warn_rate_limited(server, now, || {
                tracing::warn!(
                    server = server.0,
                    msb,
                    remembered = current as u16,
                    "server {server}'s TCP timestamp clock jumped (rebooted?): re-anchored \
                     from its answer to a health probe"
                )
            });
        }
        learnt
    }

    /// Whether a probe answer anchored `server`'s clock since the table was made or the
    /// server forgotten (an imported estimate or a reply does not count).
    pub fn probed(&self, server: ServerId) -> bool {
        self.clock().probed[server.index()].load(Relaxed)
    }

    /// Probe answers that moved a clock backwards or jumped it forwards.
    pub fn probe_resets(&self) -> u64 {
        self.probe_resets.load(Relaxed)
    }

    fn unstable(
        &self,
        server: ServerId,
        problem: ClockProblem,
        msb: u16,
        m: u16,
        now: Nanos,
    ) -> MsbLearn {
        self.warn_rate_limited(server, now, || match problem {
            ClockProblem::AheadOfRealTime => tracing::warn!(
                server = server.0,
                ?problem,
                msb,
                remembered = m,
                "a reply from server {server} carried a TCP timestamp further ahead than real \
                 time allows: not learnt (a spoofed packet, or a server clock that jumped: its \
                 next health probe re-anchors it)"
            ),
            ClockProblem::Backwards | ClockProblem::TooFrequent => tracing::warn!(
                server = server.0,
                ?problem,
                msb,
                remembered = m,
                "server {server}'s TCP timestamp clock cannot be corrected by the LB: run it with \
                 `sysctl -w net.ipv4.tcp_timestamps=2` (one clock per host, millisecond ticks) \
                 or use server-side timestamp correction"
            ),
        });
        MsbLearn::Unstable(problem)
    }

    /// Runs `warn` at most once a [`WARNING_INTERVAL`] per server.
    fn warn_rate_limited(&self, server: ServerId, now: Nanos, warn: impl FnOnce()) {
        let last = &self.last_warning[server.index()];
        let previous = last.load(Relaxed);
        if (previous == 0 || now.saturating_sub(previous) >= WARNING_INTERVAL)
            && last
                .compare_exchange(previous, now.max(1), Relaxed, Relaxed)
                .is_ok()
        {
            warn();
        }
    }

    /// Moves M^ of `server` forward to `m` (never back), and its restore entries with it,
    /// if its generation is still `generation` (read before `m` was worked out).
    /// `only_if_known`: a refresh must not bring back a server forgotten meanwhile.
    fn raise_estimate(
        &self,
        server: ServerId,
        m: u16,
        generation: u32,
        only_if_known: bool,
    ) -> bool {
        let cell = &self.clock().estimates[server.index()];
        let mut current = cell.load(SeqCst);
        loop {
            if current & GENERATION != generation || (current & KNOWN == 0 && only_if_known) {
                return false;
            }
            if current & KNOWN != 0 && m.wrapping_sub(current as u16) as i16 <= 0 {
                return false;
            }
            // SeqCst: `publish` relies on one total order of estimate writes and its loads.
            match cell.compare_exchange_weak(current, generation | KNOWN | m as u32, SeqCst, SeqCst)
            {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.publish(server);
        self.clock().writes.fetch_add(1, Relaxed);
        true
    }

    /// Sets the estimate of `server` to `value` (`KNOWN | M^`, or 0), wherever the current
    /// one is, in a new generation, and republishes its restore entries.
    fn set_estimate(&self, server: ServerId, value: u32) {
        let cell = &self.clock().estimates[server.index()];
        let mut current = cell.load(SeqCst);
        loop {
            let next = (current & GENERATION).wrapping_add(GENERATION_ONE) | value;
            match cell.compare_exchange_weak(current, next, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.publish(server);
        self.clock().writes.fetch_add(1, Relaxed);
    }

    /// Moves every known server's M^ to where its clock must be by `now`, so that a server
    /// that sends nothing through this LB (quiet, or answering through another instance)
    /// keeps a current estimate. The daemon calls it every second; between calls, M^ may
    /// lag a second behind, which the restore window absorbs. Returns how many moved.
    pub fn refresh(&self, now: Nanos) -> usize {
        let now_ms = millis(now);
        let mut moved = 0;
        for index in 0..ID_SPACE {
            let server = ServerId(index as u16);
            let generation = self.clock().estimates[index].load(SeqCst) & GENERATION;
            let anchor_cell = &self.clock().anchors[index];
            let anchor = anchor_cell.load(SeqCst);
            if anchor != UNKNOWN {
                let m = estimate_msb(anchor, now_ms);
                if self.raise_estimate(server, m, generation, true) {
                    moved += 1;
                }
                if elapsed_ms(anchor, now_ms) > REANCHOR_AFTER_MS {
                    let young = self::anchor(now_ms, estimate_tsval(anchor, now_ms));
                    // A reply or a probe may have re-anchored it meanwhile: that is better.
                    let _ = anchor_cell.compare_exchange(anchor, young, SeqCst, Relaxed);
                }
            }
            let limit_cell = &self.clock().limits[index];
            let limit = limit_cell.load(SeqCst);
            if limit != UNKNOWN && elapsed_ms(limit, now_ms) > REANCHOR_AFTER_MS {
                let young = self::anchor(now_ms, latest_tsval(limit, now_ms));
                let _ = limit_cell.compare_exchange(limit, young, SeqCst, Relaxed);
            }
        }
        moved
    }

    /// The original MSB for an echoed cookie of `epoch`, or `None` while the clock is unknown.
    #[inline]
    pub fn restore(&self, server: ServerId, epoch: u16) -> Option<u16> {
        self.restore_unmasked(self.layout.unmasked(server, epoch))
            .map(u16::from_be)
    }

    /// [`restore`](MsbTable::restore) for an unmasked cookie, in network byte order: the
    /// `u16` whose bytes in memory are the two the packet must carry (`u16::from_be` gives
    /// the MSB itself). One load: this is what a client packet pays for the restore.
    #[inline(always)]
    pub fn restore_unmasked(&self, cookie: Unmasked) -> Option<u16> {
        let entry = self.restores[cookie.0 as usize].load(Relaxed);
        if entry & BEYOND_IDLE_LIMIT != 0 {
            // Apart from the answer, so that the common case tests one bit and returns;
            // inline, since a call here would make every caller save registers for it.
            self.echoes_beyond_idle_limit.fetch_add(1, Relaxed);
        }
        (entry & KNOWN != 0).then_some(entry as u16)
    }

    /// Echoes restored that were certainly older than the layout's idle limit (more than
    /// 2^(k-1) periods behind M^): their connections' next server segment may be dropped
    /// by the client's PAWS check.
    pub fn echoes_beyond_idle_limit(&self) -> u64 {
        self.echoes_beyond_idle_limit.load(Relaxed)
    }

    /// Rewrites `server`'s 2^k restore entries from its estimate, after every write of it.
    /// Two writers can publish at once (a worker learning and the refresh, or an import),
    /// and the one that read the older estimate may store last; so each writer reads the
    /// estimate again after its stores and goes round until the estimate it published is
    /// still the estimate. With every access here and every estimate write SeqCst, the last
    /// stores to the entries are then always of the last estimate. Costs 2^k fenced stores
    /// once a minute per server.
    fn publish(&self, server: ServerId) {
        let estimate = &self.clock().estimates[server.index()];
        let mut published = estimate.load(SeqCst);
        loop {
            for epoch in 0..self.layout.epochs() {
                let at = self.layout.unmasked(server, epoch).0 as usize;
                self.restores[at].store(restore_entry(self.layout, published, epoch), SeqCst);
            }
            let now = estimate.load(SeqCst);
            if now == published {
                return;
            }
            published = now;
        }
    }

    /// M^: the MSB the restore entries of `server` are computed from.
    pub fn get(&self, server: ServerId) -> Option<u16> {
        let current = self.clock().estimates[server.index()].load(Relaxed);
        (current & KNOWN != 0).then_some(current as u16)
    }

    /// Forgets a server (its id was retired or is being reused by another host).
    pub fn forget(&self, server: ServerId) {
        let index = server.index();
        // The order `learn_slow` relies on, as in `learn_probe`.
        self.clock().probed[index].store(false, SeqCst);
        self.clock().limits[index].store(UNKNOWN, SeqCst);
        self.clock().anchors[index].store(UNKNOWN, SeqCst);
        self.seen[index].store(0, SeqCst);
        self.set_estimate(server, 0);
    }

    /// Number of writes so far; a persister saves when this moved.
    pub fn write_count(&self) -> u64 {
        self.clock().writes.load(Relaxed)
    }

    /// Every known server's estimated TSval at `now`, for persisting across a restart.
    pub fn export(&self, now: Nanos) -> Vec<(ServerId, u32)> {
        let now_ms = millis(now);
        (0..ID_SPACE)
            .filter_map(|index| {
                let anchor = self.clock().anchors[index].load(Relaxed);
                let known = self.clock().estimates[index].load(Relaxed) & KNOWN != 0;
                (anchor != UNKNOWN && known)
                    .then(|| (ServerId(index as u16), estimate_tsval(anchor, now_ms)))
            })
            .collect()
    }

    /// The clocks the `seen` words hold, each as the first TSval of its MSB: what an
    /// earlier process over the same words learnt, never ahead of the server's clock.
    pub fn kept_clocks(&self) -> Vec<(ServerId, u32)> {
        Self::clocks_in(&self.seen)
    }

    /// [`kept_clocks`](Self::kept_clocks) read from `seen` words alone, without making a
    /// table over them (which would clear the learning words it is given).
    pub fn clocks_in(seen: &[AtomicU32; ID_SPACE]) -> Vec<(ServerId, u32)> {
        (0..ID_SPACE)
            .filter_map(|index| {
                let word = seen[index].load(SeqCst);
                (word & KNOWN != 0).then_some((ServerId(index as u16), (word & 0xffff) << 16))
            })
            .collect()
    }

    /// [`import`](Self::import)s those of `values` whose MSB is ahead of the server's
    /// current estimate, or whose server has none: two sources of clocks (the state file,
    /// a pinned map's words) merged so that a restart never moves an estimate backwards.
    pub fn import_newer(&self, values: &[(ServerId, u32)], now: Nanos) {
        let newer: Vec<(ServerId, u32)> = values
            .iter()
            .copied()
            .filter(|&(server, tsval)| match self.get(server) {
                None => true,
                Some(current) => ((tsval >> 16) as u16).wrapping_sub(current) as i16 > 0,
            })
            .collect();
        if !newer.is_empty() {
            self.import(&newer, now);
        }
    }

    /// Sets each server's clock to the TSval it is estimated to show at `now` (a persisted
    /// estimate carried forward by the time the LB was down, or a test's clock).
    pub fn import(&self, values: &[(ServerId, u32)], now: Nanos) {
        let now_ms = millis(now);
        for &(server, tsval) in values {
            let index = server.index();
            let msb = (tsval >> 16) as u16;
            // Not a probe, and not a bound either: an imported estimate runs a little slow
            // by design, by an amount that grows with how long the server was quiet, so
            // the first reply after it re-anchors the bound (or the first probe does).
            self.clock().probed[index].store(false, SeqCst);
            self.clock().limits[index].store(UNKNOWN, SeqCst);
            self.clock().anchors[index].store(anchor(now_ms, tsval), SeqCst);
            self.seen[index].store(KNOWN | msb as u32, SeqCst);
            self.set_estimate(server, KNOWN | msb as u32);
        }
        self.clock().writes.fetch_add(1, Relaxed);
    }
}

fn millis(now: Nanos) -> u32 {
    (now / NANOS_PER_MS) as u32
}

fn anchor(now_ms: u32, tsval: u32) -> u64 {
    // `UNKNOWN` is all ones; a real anchor one tick off it is as good.
    (((now_ms as u64) << 32) | tsval as u64).min(UNKNOWN - 1)
}

/// LB ms since the anchor; 0 if a worker's clock reading is a little behind the anchor's.
fn elapsed_ms(anchor: u64, now_ms: u32) -> u32 {
    (now_ms.wrapping_sub((anchor >> 32) as u32) as i32).max(0) as u32
}

/// The TSval the anchored server is estimated to send at `now_ms`, never ahead of it for a
/// server clock up to [`DRIFT_ALLOWANCE_SHIFT`]'s share slower than the LB's.
fn estimate_tsval(anchor: u64, now_ms: u32) -> u32 {
    carried_forward(anchor as u32, elapsed_ms(anchor, now_ms))
}

/// `tsval` as a server clock sends it `elapsed_ms` of LB time later, run
/// [`DRIFT_ALLOWANCE_SHIFT`]'s share slow: the one rule for the estimate and for a
/// persisted clock carried over the downtime.
fn carried_forward(tsval: u32, elapsed_ms: u32) -> u32 {
    tsval.wrapping_add(elapsed_ms - (elapsed_ms >> DRIFT_ALLOWANCE_SHIFT))
}

/// The latest TSval the anchored server may send at `now_ms`: its clock up to
/// [`DRIFT_ALLOWANCE_SHIFT`]'s share faster than the LB's.
fn latest_tsval(anchor: u64, now_ms: u32) -> u32 {
    let elapsed = elapsed_ms(anchor, now_ms);
    (anchor as u32)
        .wrapping_add(elapsed)
        .wrapping_add(elapsed >> DRIFT_ALLOWANCE_SHIFT)
}

/// Whether a reply's `tsval` is further ahead than real time allows since `anchor`.
fn ahead_of_real_time(anchor: u64, tsval: u32, now_ms: u32) -> bool {
    tsval.wrapping_sub(latest_tsval(anchor, now_ms)) as i32 > TICK_SLACK as i32
}

fn estimate_msb(anchor: u64, now_ms: u32) -> u16 {
    (estimate_tsval(anchor, now_ms) >> 16) as u16
}

/// What an echo of `epoch` is restored to under `estimate` (`KNOWN | M^`, or 0): the newest
/// MSB `<= M^ + 1` that is `epoch` modulo 2^k, as a [`MsbTable::restore_unmasked`] entry.
/// Flagged when that MSB is more than 2^(k-1) periods behind M^.
fn restore_entry(layout: CookieLayout, estimate: u32, epoch: u16) -> u32 {
    if estimate & KNOWN == 0 {
        return 0;
    }
    let m = estimate as u16;
    let newest = m.wrapping_add(1);
    let msb = newest.wrapping_sub(newest.wrapping_sub(epoch) & (layout.epochs() - 1));
    let age = m.wrapping_sub(msb) as i16;
    let beyond = if age > (layout.epochs() / 2) as i16 {
        BEYOND_IDLE_LIMIT
    } else {
        0
    };
    KNOWN | beyond | msb.to_be() as u32
}

/// `N` atomics made by `make`, on the heap (atomics are not `Clone`, so not `boxed_array`).
fn atomics<T, const N: usize>(make: impl FnMut() -> T) -> Box<[T; N]> {
    std::iter::repeat_with(make)
        .take(N)
        .collect::<Box<[_]>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("N atomics were made"))
}

/// The words of a clock table that learning reads and writes besides `seen` and the
/// restore entries, per server id; laid out as the XDP program's `struct msb_clock_words`
/// (bpf/include/cheetah_shared.h), so the kernel learns replies in the very same words
/// (one entry of its mmapable `msb_clock` array).
#[repr(C)]
pub struct ClockWords {
    /// `(LB ms as u32) << 32 | TSval` at the last advance of `seen` or probe answer (or
    /// moved forward by [`MsbTable::refresh`]), or `UNKNOWN`. One word, so the pair is
    /// always consistent.
    pub anchors: [AtomicU64; ID_SPACE],
    /// The anchor replies are bounded by, in the same form: the last probe answer's, or,
    /// while the server was never probed, the last learnt reply's; `UNKNOWN` when nothing
    /// bounds them (a clock just imported). Carried forward by the refresh at the fastest
    /// rate a server clock may run, so it never holds a real reply back.
    pub limits: [AtomicU64; ID_SPACE],
    /// `generation | KNOWN | M^`. A reply or the refresh only moves M^ forward; a probe,
    /// an import or a forget sets it anywhere and bumps the generation.
    pub estimates: [AtomicU32; ID_SPACE],
    /// Whether a probe anchored the server's clock since the table was made (or the server
    /// forgotten).
    pub probed: [AtomicBool; ID_SPACE],
    /// Bumped on every write of an estimate, so a persister knows when to save.
    pub writes: AtomicU64,
}

impl ClockWords {
    /// Words on the heap, owned by the table they are given to (cleared by it).
    pub fn owned() -> Words<ClockWords> {
        Words::owned(Self::owned_words())
    }

    /// One set of words on the heap, zeroed in place: they are 336 KiB, too many to build
    /// on a stack first.
    pub fn owned_words() -> Box<[ClockWords]> {
        let words = Box::<[ClockWords]>::new_zeroed_slice(1);
        // SAFETY: all-zero bytes are valid atomics (integers and `false`).
        unsafe { words.assume_init() }
    }

    /// Someone else's words that live as long as the process (the XDP program's mapped
    /// `msb_clock`).
    pub fn borrowed(words: &'static ClockWords) -> Words<ClockWords> {
        Words::borrowed(std::slice::from_ref(words))
    }

    /// No clock known: what a table starts from.
    fn clear(&self) {
        for index in 0..ID_SPACE {
            self.anchors[index].store(UNKNOWN, SeqCst);
            self.limits[index].store(UNKNOWN, SeqCst);
            self.estimates[index].store(0, SeqCst);
            self.probed[index].store(false, SeqCst);
        }
        self.writes.store(0, SeqCst);
    }
}

/// `N` words of a clock table: owned (on the heap), or someone else's that live as long as
/// the process (a memory-mapped BPF array). Either way one pointer, read like a `Box`: a
/// packet pays no extra load or branch for the choice.
pub struct SharedWords<const N: usize> {
    words: NonNull<[AtomicU32; N]>,
    owned: bool,
}

// SAFETY: the words are atomics, which any thread may share; an owned array is freed only
// by the one `SharedWords` that owns it.
unsafe impl<const N: usize> Send for SharedWords<N> {}
unsafe impl<const N: usize> Sync for SharedWords<N> {}

impl<const N: usize> SharedWords<N> {
    /// `N` zero words on the heap, freed with this value.
    pub fn zeroed() -> Self {
        let owned: Box<[AtomicU32; N]> = atomics(|| AtomicU32::new(0));
        SharedWords {
            words: NonNull::from(Box::leak(owned)),
            owned: true,
        }
    }

    /// Words that outlive every table: a static array, or a mapping the process never
    /// unmaps.
    pub fn borrowed(words: &'static [AtomicU32; N]) -> Self {
        SharedWords {
            words: NonNull::from(words),
            owned: false,
        }
    }
}

impl<const N: usize> std::ops::Deref for SharedWords<N> {
    type Target = [AtomicU32; N];

    #[inline(always)]
    fn deref(&self) -> &[AtomicU32; N] {
        // SAFETY: `words` is a live array: owned and freed only in `drop`, or `'static`.
        unsafe { self.words.as_ref() }
    }
}

impl<const N: usize> Drop for SharedWords<N> {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: made by `Box::leak` in `zeroed`, and dropped only here, once.
            drop(unsafe { Box::from_raw(self.words.as_ptr()) });
        }
    }
}

/// How old a persisted estimate may be and still be loaded. The estimate is carried forward
/// by the wall-clock time the LB was down, so age alone does not spoil it; but a server may
/// have rebooted meanwhile, and after this long the connections that were open have mostly
/// given up retransmitting, so re-learning from traffic loses nothing.
pub const MAX_PERSISTED_AGE_MS: u64 = 600_000;

/// What the daemon writes to disk so the clock estimates survive a restart (any serde format).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PersistedMsb {
    /// Wall-clock time of the save, in ms since the Unix epoch (passed in by the daemon).
    pub saved_at_unix_ms: u64,
    /// (server id, the TSval the server was estimated to send at the save) for every server
    /// whose clock is known.
    pub servers: Vec<(u16, u32)>,
}

/// Why persisted values were not loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistedMsbError {
    /// Saved longer ago than [`MAX_PERSISTED_AGE_MS`] (or in the future).
    Stale { age_ms: i64 },
    /// A server id the cookie layout cannot carry.
    BadServerId(u16),
}

impl std::fmt::Display for PersistedMsbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PersistedMsbError::Stale { age_ms } => write!(
                f,
                "saved {age_ms} ms ago, more than {MAX_PERSISTED_AGE_MS} ms: each server's timestamp clock will be re-learnt from its next packet"
            ),
            PersistedMsbError::BadServerId(id) => {
                write!(f, "server id {id} does not fit in the cookie layout")
            }
        }
    }
}

impl MsbTable {
    pub fn persist(&self, now: Nanos, now_unix_ms: u64) -> PersistedMsb {
        PersistedMsb {
            saved_at_unix_ms: now_unix_ms,
            servers: self
                .export(now)
                .into_iter()
                .map(|(id, tsval)| (id.0, tsval))
                .collect(),
        }
    }

    /// Loads a persisted table if it is fresh enough, each estimate carried forward by the
    /// wall-clock time since the save; returns how many servers it knew.
    pub fn load_persisted(
        &self,
        saved: &PersistedMsb,
        now: Nanos,
        now_unix_ms: u64,
    ) -> Result<usize, PersistedMsbError> {
        let age_ms = now_unix_ms as i64 - saved.saved_at_unix_ms as i64;
        if !(0..=MAX_PERSISTED_AGE_MS as i64).contains(&age_ms) {
            return Err(PersistedMsbError::Stale { age_ms });
        }
        let down = age_ms as u32;
        let values = saved
            .servers
            .iter()
            .map(|&(id, tsval)| {
                ServerId::new(id)
                    .filter(|_| self.layout.holds(id))
                    .map(|id| (id, carried_forward(tsval, down)))
                    .ok_or(PersistedMsbError::BadServerId(id))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.import(&values, now);
        Ok(values.len())
    }
}

#[cfg(test)]
mod tests;
