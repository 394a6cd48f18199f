//! The harness's own account of each server's timestamp clock, to hold restored echoes to.

use cheetah_core::cookie::CookieLayout;
use cheetah_core::types::{Nanos, ServerId, NANOS_PER_MS};

use super::REACHABLE_IDS;

/// Whole ms, as the LB reads its clock.
fn lb_ms(at: Nanos) -> u64 {
    at / NANOS_PER_MS
}

/// The latest TSval a reply may carry at `now` by `bound` (before the slack): the LB ms
/// since, and 1/2048 of them more for a server clock running fast.
fn latest(bound: (u32, Nanos), now: Nanos) -> u32 {
    let elapsed = (lb_ms(now) - lb_ms(bound.1)) as u32;
    bound.0.wrapping_add(elapsed + (elapsed >> 11))
}

/// `a` is later than `b` in 16-bit serial arithmetic.
pub(super) fn later(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) > 0
}

/// The harness's own account of each server's timestamp clock, from what the servers sent
/// through the LB and what the input imported, kept without asking the core's `MsbTable`.
///
/// The layout promises (docs/timestamps.md): an echo of epoch e is restored to the newest
/// MSB `<= M^ + 1` that is e mod 2^k, where M^ is the LB's estimate of the server's MSB now.
/// The model cannot know M^ exactly (the LB reads its clock in whole ms, and carries the
/// estimate forward up to 1/2048 slower than real time), so it keeps bounds `low..=high`
/// on it, from the same three events the LB learns from:
/// * a reply whose MSB is later than every MSB seen from that server moves M^ to at least
///   that MSB and becomes the anchor (the same MSB, one earlier, or a clock that went
///   further back teach nothing), unless its TSval is more than 2 s ahead of the bound's
///   anchor carried forward by the LB time since (ms as the LB reads them), 1/2048 fast:
///   then it teaches nothing either. The bound's anchor is the last reply learnt (no
///   probes here), none after an import, carried forward that way by a refresh once it
///   is an hour old;
/// * a refresh at `now` carries M^ to the anchor's TSval plus the LB time since, less at
///   most 1/2048 of it;
/// * an import sets the clock (and M^) to the imported TSval.
///
/// Every window of M^ in `low..=high` holds the same MSB for an epoch when that MSB is in
/// all of them; for such an echo of an MSB the server actually sent, the restore must give
/// exactly that MSB. For any other echo (forged, or too old) it must still be in the window.
pub struct Clocks {
    epochs: u16,
    servers: [Option<Clock>; REACHABLE_IDS as usize],
}

struct Clock {
    /// Every MSB the server sent (or was imported), with the LB time it was seen at.
    sent: Vec<(u16, Nanos)>,
    /// The latest MSB seen: what a reply must be later than to teach the clock.
    seen: u16,
    /// The TSval that last moved `seen`, or was imported, and when.
    anchor: (u32, Nanos),
    /// What replies are bounded by: a TSval and when (`None` after an import).
    bound: Option<(u32, Nanos)>,
    low: u16,
    high: u16,
}

thread_local! {
    /// (exact, beyond) over the thread's runs, so the corpus test can show the model checked
    /// something.
    static ECHO_STATS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Over this thread's runs: (echoes held to an MSB their server sent, echoes found beyond
/// the idle limit and counted by the core).
pub fn echo_stats() -> (u64, u64) {
    ECHO_STATS.with(|s| s.get())
}

impl Clocks {
    pub fn new(layout: CookieLayout) -> Self {
        Clocks {
            epochs: 1 << layout.epoch_bits(),
            servers: Default::default(),
        }
    }

    fn clock(&mut self, server: ServerId) -> Option<&mut Clock> {
        self.servers.get_mut(server.index())?.as_mut()
    }

    pub fn forget(&mut self, server: ServerId) {
        if let Some(slot) = self.servers.get_mut(server.index()) {
            *slot = None;
        }
    }

    pub fn import(&mut self, server: ServerId, tsval: u32, now: Nanos) {
        let msb = (tsval >> 16) as u16;
        if let Some(slot) = self.servers.get_mut(server.index()) {
            let mut sent = slot.take().map(|c| c.sent).unwrap_or_default();
            sent.push((msb, now));
            *slot = Some(Clock {
                sent,
                seen: msb,
                anchor: (tsval, now),
                bound: None,
                low: msb,
                high: msb,
            });
        }
    }

    /// `server` sent `tsval` through the LB at `now`.
    pub fn sent(&mut self, server: ServerId, tsval: u32, now: Nanos) {
        let msb = (tsval >> 16) as u16;
        let Some(clock) = self.clock(server) else {
            self.import(server, tsval, now);
            if let Some(clock) = self.clock(server) {
                clock.bound = Some((tsval, now));
            }
            return;
        };
        clock.sent.push((msb, now));
        let too_far = |bound| tsval.wrapping_sub(latest(bound, now)) as i32 > 2_000;
        if later(msb, clock.seen) && !clock.bound.is_some_and(too_far) {
            clock.seen = msb;
            clock.anchor = (tsval, now);
            clock.bound = Some((tsval, now));
            if later(msb, clock.low) {
                clock.low = msb;
            }
            if later(msb, clock.high) {
                clock.high = msb;
            }
        }
    }

    pub fn refresh(&mut self, now: Nanos) {
        for clock in self.servers.iter_mut().flatten() {
            if let Some(bound) = clock.bound {
                if lb_ms(now) - lb_ms(bound.1) > 3_600_000 {
                    clock.bound = Some((latest(bound, now), now));
                }
            }
            let (tsval, at) = clock.anchor;
            // The LB reads whole ms, so it may see up to 1 ms more than elapsed.
            let elapsed = (now - at) / NANOS_PER_MS;
            let slowest = tsval.wrapping_add((elapsed - elapsed.div_ceil(2048)) as u32);
            let fastest = tsval.wrapping_add((elapsed + 1) as u32);
            let (slowest, fastest) = ((slowest >> 16) as u16, (fastest >> 16) as u16);
            if later(slowest, clock.low) {
                clock.low = slowest;
            }
            if later(fastest, clock.high) {
                clock.high = fastest;
            }
        }
    }

    /// Whether an echo of `msb` is restored to `msb` whatever M^ is within the bounds.
    pub fn certainly_restores(&self, server: ServerId, msb: u16) -> bool {
        let Some(Some(clock)) = self.servers.get(server.index()) else {
            return false;
        };
        let span = clock.high.wrapping_sub(clock.low);
        let back = clock.low.wrapping_add(1).wrapping_sub(msb);
        span < self.epochs && back < self.epochs - span
    }

    /// The rule: the newest MSB `<= m + 1` that is `epoch` mod 2^k.
    fn rule(&self, m: u16, epoch: u16) -> u16 {
        let newest = m.wrapping_add(1);
        newest.wrapping_sub(newest.wrapping_sub(epoch) % self.epochs)
    }

    /// A client's echo of `epoch` routed by cookie to `server` left with MSB `restored`;
    /// the core counted `counted_beyond` echoes beyond the idle limit meanwhile.
    pub(super) fn check_restore(
        &mut self,
        server: ServerId,
        epoch: u16,
        restored: u16,
        counted_beyond: u64,
    ) {
        let epochs = self.epochs;
        let Some(Some(clock)) = self.servers.get(server.index()) else {
            panic!("echo routed by cookie to {server:?}, whose clock the LB never learnt");
        };
        let (low, high) = (clock.low, clock.high);
        assert_eq!(
            restored % epochs,
            epoch,
            "the restored MSB {restored:#06x} has the echo's epoch"
        );
        let (oldest, newest) = (self.rule(low, epoch), self.rule(high, epoch));
        assert!(
            restored.wrapping_sub(oldest) <= newest.wrapping_sub(oldest),
            "{server:?}: echo of epoch {epoch} restored to {restored:#06x}, outside the window: \
             M^ is {low:#06x}..={high:#06x}, so {oldest:#06x}..={newest:#06x}"
        );
        let sent = clock
            .sent
            .iter()
            .map(|&(msb, _)| msb)
            .filter(|&msb| msb % epochs == epoch)
            .find(|&msb| self.certainly_restores(server, msb));
        if let Some(msb) = sent {
            assert_eq!(
                restored, msb,
                "{server:?} sent MSB {msb:#06x} (epoch {epoch}) within the window of M^ in \
                 {low:#06x}..={high:#06x}: its echo must come back as that MSB"
            );
            ECHO_STATS.with(|s| s.set((s.get().0 + 1, s.get().1)));
        }
        // Past the idle limit: more than 2^(k-1) periods behind M^, for every M^ possible.
        let age = |m: u16| m.wrapping_sub(restored) as i16;
        let (young, old) = (age(low), age(high));
        let limit = (epochs / 2) as i16;
        if young > limit {
            assert_eq!(counted_beyond, 1, "{server:?}: an echo {young}..={old} periods behind M^ is counted beyond the idle limit");
            ECHO_STATS.with(|s| s.set((s.get().0, s.get().1 + 1)));
        } else if old <= limit {
            assert_eq!(
                counted_beyond, 0,
                "{server:?}: an echo {young}..={old} periods behind M^ is within the idle limit"
            );
        }
    }
}
