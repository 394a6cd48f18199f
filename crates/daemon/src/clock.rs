//! The daemon's clocks: the monotonic one every core call and the data path take as `now`,
//! and the wall clock of what is saved to disk.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cheetah_core::types::Nanos;

/// The daemon's monotonic clock: nanoseconds since start-up, the `now` every core call
/// takes (the data path must use the same clock, so quarantines and merges agree).
///
/// It reads CLOCK_MONOTONIC, the clock of the XDP program's `bpf_ktime_get_ns`, so the
/// program gets the same `now` from its start ([`monotonic_base_ns`](Self::monotonic_base_ns),
/// published in `lb_config.clock_base_ns`).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_ns: u64,
}

impl Clock {
    pub fn start() -> Self {
        Clock {
            base_ns: monotonic_ns(),
        }
    }

    /// The clock of an earlier process that started at CLOCK_MONOTONIC `base_ns`, going
    /// on where it is (a restart over pinned maps, whose times are that clock's). A base
    /// ahead of now (not this boot's) starts a new clock.
    pub fn resume(base_ns: u64) -> Self {
        if base_ns > monotonic_ns() {
            return Self::start();
        }
        Clock { base_ns }
    }

    #[inline]
    pub fn now(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.base_ns)
    }

    /// CLOCK_MONOTONIC at which this clock read 0.
    pub fn monotonic_base_ns(&self) -> u64 {
        self.base_ns
    }
}

/// CLOCK_MONOTONIC in nanoseconds (what `Instant` and `bpf_ktime_get_ns` read).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

impl Default for Clock {
    fn default() -> Self {
        Self::start()
    }
}

/// Milliseconds since the Unix epoch (wall clock, for what is saved to disk).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}
