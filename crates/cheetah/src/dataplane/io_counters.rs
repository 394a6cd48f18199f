//! Counters of the packet I/O around the core, one set per worker, written only by it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! io_counters {
    ($($field:ident => $help:literal;)*) => {
        #[derive(Default)]
        pub struct IoCounters {
            $(pub $field: AtomicU64,)*
        }

        impl IoCounters {
            pub fn samples(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
                [$((stringify!($field), $help, self.$field.load(Relaxed)),)*].into_iter()
            }
        }
    };
}

io_counters! {
    rx_packets => "Frames received from the AF_XDP sockets.";
    rx_bytes => "Bytes received from the AF_XDP sockets.";
    tx_packets => "Frames queued for transmission.";
    tx_bytes => "Bytes queued for transmission.";
    rx_batches => "Non-empty receive batches.";
    tx_ring_full => "Frames dropped because a TX ring was full.";
    fill_ring_empty => "Times a fill ring ran dry and the kernel had to be woken.";
    poll_wakeups => "Times the worker slept in poll() and woke up.";
    no_route => "Packets dropped because their next hop was unknown (no route, no neighbour entry, or an interface the LB does not serve).";
    frames_copied => "Extra frames made for ICMP errors copied to every server.";
    no_free_frame => "Copies not made because the worker had no free frame.";
    passed_unhandled => "Packets the core handed to the host, which AF_XDP cannot re-inject (dropped).";
    missing_metadata => "Server replies without the XDP program's next-hop metadata (dropped).";
}

impl IoCounters {
    /// Single-writer increment: a load and a store, not a locked read-modify-write.
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
    }
}
