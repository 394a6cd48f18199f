//! The daemon's clocks: the monotonic one every core call and the data path take as `now`,
//! and the wall clock of what is saved to disk.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cheetah_core::types::Nanos;

/// The daemon's monotonic clock: nanoseconds since start-up, the `now` every core call
/// takes (the data path must use the same clock, so quarantines and merges agree).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
}

impl Clock {
    pub fn start() -> Self {
        Clock {
            base: Instant::now(),
        }
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

/// Milliseconds since the Unix epoch (wall clock, for what is saved to disk).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}
