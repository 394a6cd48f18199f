//! The daemon's clocks: the monotonic one every core call and the data path take as `now`,
//! and the wall clock of what is saved to disk.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cheetah_core::types::Nanos;

/// The daemon's monotonic clock: nanoseconds since start-up, the `now` every core call
/// takes (the data path must use the same clock, so quarantines and merges agree).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
    /// CLOCK_MONOTONIC at `base`, in ns: what the XDP program subtracts from
    /// `bpf_ktime_get_ns` (the same clock) to get this clock's `now`.
    monotonic_base_ns: u64,
}

impl Clock {
    pub fn start() -> Self {
        // Instant is CLOCK_MONOTONIC on Linux; read back to back, the two differ by the
        // time between the reads (well under a microsecond).
        let base = Instant::now();
        Clock {
            base,
            monotonic_base_ns: monotonic_ns(),
        }
    }

    /// The CLOCK_MONOTONIC reading (ns) at which `now` was 0.
    pub fn monotonic_base_ns(&self) -> u64 {
        self.monotonic_base_ns
    }

    #[inline]
    pub fn now(&self) -> Nanos {
        self.base.elapsed().as_nanos() as Nanos
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::start()
    }
}

/// CLOCK_MONOTONIC in ns, the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Milliseconds since the Unix epoch (wall clock, for what is saved to disk).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}
