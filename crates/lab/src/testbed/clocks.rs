//! Which timestamp clock each testbed server gets: the offset its tc program adds to the
//! host's TCP clock (docs/testbed.md, "Server clocks").
//!
//! All namespaces share the host's TCP clock, so by default every server would send the
//! same TSvals and change its MSB (TSval >> 16, every 65.536 s) at the same instant. Real
//! servers booted at different times; the offsets make the testbed's servers differ in
//! the ways that could trip the LB:
//!
//! - s1: 0, the host's clock;
//! - s2: an MSB period and a half: its MSB is always s1's + 1 or + 2, and changes halfway
//!   between s1's changes;
//! - s3: TSval wraps from 0xffffffff to 0 between [`WRAP_AFTER_MIN_MS`] and
//!   [`WRAP_AFTER_MIN_MS`] + half a period after `up`, at a quarter period from s1's and
//!   s2's changes, so a test that starts right after `up` sees the 32-bit wrap;
//! - s4: 2^31, the farthest MSB from s1's, changing at the same instants;
//! - s5 and later: (j - 4) times 2^32 / golden ratio, the sequence that keeps any number of
//!   points far apart, moved on by 2^18 while within an MSB of an earlier server's.

use serde::{Deserialize, Serialize};

pub use cheetah_core::cookie::tcp_ts::MSB_PERIOD_MS;
/// s3's wrap comes no sooner than this after `up`, and at most half a period later.
pub const WRAP_AFTER_MIN_MS: u64 = 58_000;
/// 2^32 / golden ratio, rounded to odd.
const GOLDEN: u32 = 0x9e37_79b9;

/// Whether the servers get clocks of their own (`--server-clocks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerClocks {
    /// Offsets by the rule above, applied by a tc program on each server's interface.
    #[default]
    Distinct,
    /// The host's clock everywhere, no tc program (how the testbed was before).
    Shared,
}

impl ServerClocks {
    pub fn name(self) -> &'static str {
        match self {
            ServerClocks::Distinct => "distinct",
            ServerClocks::Shared => "shared",
        }
    }
}

/// The offsets (ms, added to the host's TCP clock) of servers 1..=`servers` for a testbed
/// brought up when the host's CLOCK_MONOTONIC read `now_ms`.
pub fn offsets(clocks: ServerClocks, servers: u16, now_ms: u64) -> Vec<u32> {
    let mut offsets = Vec::with_capacity(servers.into());
    for j in 1..=u32::from(servers) {
        let offset = match (clocks, j) {
            (ServerClocks::Shared, _) => 0,
            (_, 1) => 0,
            (_, 2) => (MSB_PERIOD_MS + MSB_PERIOD_MS / 2) as u32,
            (_, 3) => wrap_offset(now_ms),
            (_, 4) => 1 << 31,
            (_, j) => {
                let mut offset = (j - 4).wrapping_mul(GOLDEN);
                while offsets.iter().any(|&o| within_an_msb(o, offset)) {
                    offset = offset.wrapping_add(1 << 18);
                }
                offset
            }
        };
        offsets.push(offset);
    }
    offsets
}

/// The offset under which the clock reaches 2^32 at the first host time, at least
/// [`WRAP_AFTER_MIN_MS`] after `now_ms`, that lies a quarter period from a multiple of
/// the period (s1's changes) and so also a quarter period from s2's.
fn wrap_offset(now_ms: u64) -> u32 {
    let quarter = MSB_PERIOD_MS / 4;
    let earliest = now_ms + WRAP_AFTER_MIN_MS;
    // Quarter-period points that are not multiples of a half period: 1/4 and 3/4.
    let mut wrap_at = earliest.next_multiple_of(quarter);
    if (wrap_at / quarter).is_multiple_of(2) {
        wrap_at += quarter;
    }
    // TSval = (host ms + offset) mod 2^32 reaches 0 when host ms = wrap_at.
    (wrap_at as u32).wrapping_neg()
}

/// Whether two clocks can ever show the same MSB: only when they are less than an MSB
/// period apart (either way round the 32-bit circle).
fn within_an_msb(a: u32, b: u32) -> bool {
    let apart = a.wrapping_sub(b).min(b.wrapping_sub(a));
    u64::from(apart) < MSB_PERIOD_MS
}

/// The host's CLOCK_MONOTONIC in ms: with `tcp_timestamps=2`, its low 32 bits are the TSval
/// every namespace's TCP sends.
pub fn monotonic_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

/// The TSval a server clock with `offset` sends at host time `host_ms`.
pub fn tsval_at(host_ms: u64, offset: u32) -> u32 {
    (host_ms as u32).wrapping_add(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_MS: u64 = 3_600_000;

    #[test]
    fn the_first_four_servers_follow_the_documented_rule() {
        let now = 5 * HOUR_MS + 12_345;
        let offsets = offsets(ServerClocks::Distinct, 4, now);
        assert_eq!(offsets[0], 0);
        assert_eq!(offsets[1], 98_304);
        assert_eq!(offsets[3], 0x8000_0000);
        // s3 wraps 58 to 90.8 s after `up`, a quarter period off s1's changes.
        let wrap_at = (1u64 << 32) - u64::from(offsets[2]);
        let wrap_at = now + (wrap_at.wrapping_sub(now) % (1 << 32));
        let after = wrap_at - now;
        assert!(
            (WRAP_AFTER_MIN_MS..WRAP_AFTER_MIN_MS + MSB_PERIOD_MS / 2).contains(&after),
            "{after}"
        );
        assert_eq!(tsval_at(wrap_at - 1, offsets[2]), u32::MAX);
        assert_eq!(tsval_at(wrap_at, offsets[2]), 0);
        assert!([16_384, 49_152].contains(&(wrap_at % MSB_PERIOD_MS)));
    }

    #[test]
    fn s3_wraps_between_58_and_91_s_after_up_whenever_up_runs() {
        for now in (0..3 * MSB_PERIOD_MS)
            .step_by(97)
            .chain([u64::from(u32::MAX) - 7])
        {
            let offset = offsets(ServerClocks::Distinct, 3, now)[2];
            let first_zero = (1..=91_000)
                .find(|ms| tsval_at(now + ms, offset) == 0)
                .unwrap_or_else(|| panic!("no wrap within 91 s of {now}"));
            assert!(first_zero >= WRAP_AFTER_MIN_MS, "{now}: {first_zero}");
            assert_eq!(tsval_at(now + first_zero - 1, offset), u32::MAX);
        }
    }

    #[test]
    fn no_two_servers_ever_show_the_same_msb() {
        // Not within minutes of the host clock's own wrap (uptime near a multiple of 49.7
        // days): s3 wraps then a minute or two of s1, and may share its or s2's MSB.
        for now in [0, 12_345, 40 * HOUR_MS + 999, u64::from(u32::MAX) - 300_000] {
            let offsets = offsets(ServerClocks::Distinct, 200, now);
            for (a, &x) in offsets.iter().enumerate() {
                for (b, &y) in offsets.iter().enumerate().skip(a + 1) {
                    assert!(!within_an_msb(x, y), "s{} and s{} at {now}", a + 1, b + 1);
                    // And so, at any moment, different MSBs.
                    for host in [now, now + 40_000, now + 1_000_000] {
                        assert_ne!(tsval_at(host, x) >> 16, tsval_at(host, y) >> 16);
                    }
                }
            }
        }
    }

    #[test]
    fn s2_changes_its_msb_halfway_between_s1s_changes() {
        let offsets = offsets(ServerClocks::Distinct, 2, 0);
        let s1_change = 7 * MSB_PERIOD_MS;
        assert_ne!(
            tsval_at(s1_change - 1, 0) >> 16,
            tsval_at(s1_change, 0) >> 16
        );
        let s2 = offsets[1];
        assert_eq!(
            tsval_at(s1_change - 1, s2) >> 16,
            tsval_at(s1_change, s2) >> 16
        );
        let s2_change = s1_change + MSB_PERIOD_MS / 2;
        assert_ne!(
            tsval_at(s2_change - 1, s2) >> 16,
            tsval_at(s2_change, s2) >> 16
        );
    }

    #[test]
    fn shared_clocks_are_the_hosts() {
        assert_eq!(offsets(ServerClocks::Shared, 6, 123_456), vec![0; 6]);
        assert_eq!(
            offsets(ServerClocks::Distinct, 0, 123_456),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn the_rule_depends_on_the_clock_only_through_s3() {
        let a = offsets(ServerClocks::Distinct, 40, 1_000);
        let b = offsets(ServerClocks::Distinct, 40, 9 * HOUR_MS);
        assert_ne!(a[2], b[2]);
        for (j, (x, y)) in a.iter().zip(&b).enumerate().filter(|(j, _)| *j != 2) {
            // The nudge away from s3 may move a later server; only by whole 2^18 steps.
            assert_eq!(x.wrapping_sub(*y) % (1 << 18), 0, "s{}", j + 1);
        }
    }
}
