//! When the servers' TCP timestamp MSB changes.
//!
//! With `net.ipv4.tcp_timestamps=2` (the testbed sets it in every server namespace) Linux
//! sends TSval = CLOCK_MONOTONIC in milliseconds, truncated to 32 bits, with no offset per
//! connection. All server namespaces share the host's clock, and the testbed gives each
//! server an offset of its own on the wire, so a server's 16 high bits (the bits the cookie
//! displaces and the LB must restore) change whenever its shifted millisecond clock crosses
//! a multiple of 65,536, every 65.5 s. The runner marks s1's changes on the scenario's
//! clock, to show that connections crossed them.

use std::time::Duration;

pub use crate::testbed::clocks::{monotonic_ms, MSB_PERIOD_MS};

/// Seconds after `start_ms` (a monotonic time in ms) at which the MSB changes, within
/// `within`.
pub fn msb_changes(start_ms: u64, within: Duration) -> Vec<f64> {
    let end_ms = start_ms + within.as_millis() as u64;
    let mut next = (start_ms / MSB_PERIOD_MS + 1) * MSB_PERIOD_MS;
    let mut changes = Vec::new();
    while next <= end_ms {
        changes.push((next - start_ms) as f64 / 1000.0);
        next += MSB_PERIOD_MS;
    }
    changes
}

/// The 16 high bits of the 32-bit TSval at monotonic time `ms`.
pub fn msb_at(ms: u64) -> u16 {
    ((ms & 0xffff_ffff) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_run_of_at_least_two_periods_crosses_two_changes() {
        let two_periods = Duration::from_millis(2 * MSB_PERIOD_MS);
        for start in [0, 1, 30_000, MSB_PERIOD_MS - 1, 5 * MSB_PERIOD_MS + 12_345] {
            let changes = msb_changes(start, two_periods);
            assert!(changes.len() >= 2, "start {start}: {changes:?}");
        }
        // 150 s: the default run.
        let changes = msb_changes(10_000, Duration::from_secs(150));
        assert_eq!(changes, [55.536, 121.072]);
        assert_eq!(msb_at(10_000 + 55_536), 1);
        assert_eq!(msb_at(10_000 + 55_535), 0);
    }
}
