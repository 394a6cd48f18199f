//! How far the data path has taken the core's tables, so that the API answers a change
//! only once packets see it.
//!
//! The workers read the snapshot itself, but the XDP program reads copies that the
//! daemon's main thread writes into its maps (`run.rs`, `xdp_tables.rs`), one round
//! (50 ms) plus the writing after the change. Answering before that would let the next
//! connection go to a server that just left its pool, and a script that adds a server to
//! every instance, one after the other, would see an instance drop that server's replies
//! after its command had returned (docs/api.md, "When a change applies").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The generation the data path's maps hold. Until a data path publishes, there is none
/// to wait for: its first publication is of the snapshot as it is then.
#[derive(Debug)]
pub struct PublishedGeneration(AtomicU64);

/// No data path publishes (the API alone, in tests; before `cheetah run` attaches one).
const NO_PUBLISHER: u64 = u64::MAX;

/// Between two looks at the published generation while a change waits for it.
const POLL: Duration = Duration::from_millis(2);

impl Default for PublishedGeneration {
    fn default() -> Self {
        PublishedGeneration(AtomicU64::new(NO_PUBLISHER))
    }
}

impl PublishedGeneration {
    /// The data path's maps hold `generation` and everything before it.
    pub fn published(&self, generation: u64) {
        self.0.store(generation, Ordering::Release);
    }

    /// Whether packets see every change up to `generation`.
    pub fn holds(&self, generation: u64) -> bool {
        let published = self.0.load(Ordering::Acquire);
        published == NO_PUBLISHER || published >= generation
    }

    /// Waits until packets see `generation`, for at most `bound`; whether they do.
    pub async fn reached(&self, generation: u64, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while !self.holds(generation) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_publisher_every_generation_is_held() {
        let published = PublishedGeneration::default();
        assert!(published.holds(0));
        assert!(published.holds(u64::MAX - 1));
    }

    #[test]
    fn a_publisher_holds_what_it_published_and_nothing_later() {
        let published = PublishedGeneration::default();
        published.published(7);
        assert!(published.holds(6));
        assert!(published.holds(7));
        assert!(!published.holds(8));
    }
}
