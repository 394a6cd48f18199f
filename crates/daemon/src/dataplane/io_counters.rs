//! Per-worker I/O counters: what the AF_XDP data path did with frames, beside the
//! pipeline's own [`WorkerCounters`](cheetah_core::lb::WorkerCounters).
//!
//! Each worker writes only its own `IoCounters`, so an increment is a relaxed load and
//! store (no locked read-modify-write), as in the core's counters; the API thread reads
//! them at scrape time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! io_counters {
    ($($field:ident, $help:literal;)*) => {
        /// One worker's I/O counters.
        #[derive(Debug, Default)]
        pub struct IoCounters {
            $(#[doc = $help] pub $field: AtomicU64,)*
        }

        impl IoCounters {
            /// Every counter as (name, help, value), in a fixed order.
            pub fn samples(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
                [$((stringify!($field), $help, &self.$field),)*]
                    .into_iter()
                    .map(|(name, help, value)| (name, help, value.load(Relaxed)))
            }
        }
    };
}

io_counters! {
    rx_packets, "Frames received from the AF_XDP sockets.";
    rx_bytes, "Bytes of the frames received.";
    tx_packets, "Frames queued for sending.";
    tx_bytes, "Bytes of the frames queued for sending.";
    rx_batches, "Non-empty batches taken from the RX rings.";
    tx_ring_full, "Frames dropped because a TX ring was full.";
    fill_ring_empty, "Times a fill ring ran dry and the kernel had to be woken.";
    poll_wakeups, "Times the worker woke up from poll().";
    no_route, "Frames dropped because the next hop was unknown (no route, no neighbour entry, or an interface the LB does not serve).";
    frames_copied, "Extra frames made for ICMP errors copied to every server.";
    no_free_frame, "Copies not made because the worker had no free frame.";
    passed_unhandled, "Packets the core handed to the host, which AF_XDP cannot re-inject (dropped).";
    missing_metadata, "Server replies without the XDP program's next-hop metadata (dropped).";
}

impl IoCounters {
    /// Adds `n` to a counter this worker owns (a relaxed load and store).
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_name_every_counter_once() {
        let io = IoCounters::default();
        IoCounters::add(&io.tx_ring_full, 3);
        let samples: Vec<_> = io.samples().collect();
        assert_eq!(samples.len(), 13);
        assert!(samples.contains(&(
            "tx_ring_full",
            "Frames dropped because a TX ring was full.",
            3
        )));
        let mut names: Vec<_> = samples.iter().map(|s| s.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 13);
    }
}
