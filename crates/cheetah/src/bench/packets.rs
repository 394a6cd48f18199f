//! The packets of one path: each in its own buffer, restored from a pristine copy before
//! every use.
//!
//! The pipeline rewrites packets in place (MAC, TSval/TSecr, checksum), so a buffer must be
//! put back as it arrived before it is processed again, or the second pass would measure
//! already-rewritten packets (and in cheetah mode route by a restored TSecr, i.e. garbage).
//! Only the headers are copied back by default: the pipeline never writes past the TCP
//! header, which [`PacketSet::payload_untouched`] checks for every packet before timing,
//! and copying 1448-byte payloads would bury the figure under memcpy noise.
//!
//! Passes go in bursts of [`BURST`] packets, as a DPDK or AF_XDP receive loop does: restore
//! a burst (the "NIC" writes it), then process it. Restoring one packet and processing it
//! straight after would let the restore's cache misses stall the processing in the timed
//! pass but overlap one another in the restore-only pass, so the subtraction would charge
//! the harness's memory traffic to the pipeline. In bursts, both passes run the same
//! restore phase, and the processing finds the burst's headers in L1, as after a real
//! receive burst.

use std::hint::black_box;

/// Packets restored, then processed, at a time (a typical receive burst).
pub const BURST: usize = 32;

pub struct PacketSet {
    pristine: Vec<Vec<u8>>,
    work: Vec<Vec<u8>>,
    /// Bytes to copy back per packet: the headers, or the whole frame.
    restore: Vec<usize>,
}

/// End of the TCP header of an untagged IPv4/TCP frame (what the trace holds).
fn headers_len(frame: &[u8]) -> usize {
    let l4 = 14 + (frame[14] & 0x0f) as usize * 4;
    l4 + (frame[l4 + 12] >> 4) as usize * 4
}

impl PacketSet {
    pub fn new<'a>(frames: impl IntoIterator<Item = &'a [u8]>, full_restore: bool) -> Self {
        let pristine: Vec<Vec<u8>> = frames.into_iter().map(<[u8]>::to_vec).collect();
        let work = pristine.clone();
        let restore = pristine
            .iter()
            .map(|f| {
                if full_restore {
                    f.len()
                } else {
                    headers_len(f)
                }
            })
            .collect();
        PacketSet {
            pristine,
            work,
            restore,
        }
    }

    pub fn len(&self) -> usize {
        self.pristine.len()
    }

    /// Mean bytes copied back per packet.
    pub fn mean_restore_bytes(&self) -> f64 {
        self.restore.iter().sum::<usize>() as f64 / self.len().max(1) as f64
    }

    /// Puts packet `i` back as it arrived and returns its buffer.
    #[inline(always)]
    pub fn restored(&mut self, i: usize) -> &mut [u8] {
        let len = self.restore[i];
        let work = &mut self.work[i];
        work[..len].copy_from_slice(&self.pristine[i][..len]);
        work
    }

    /// Whether everything past the restored bytes of packet `i` is still as it arrived.
    pub fn payload_untouched(&self, i: usize) -> bool {
        let len = self.restore[i];
        self.work[i][len..] == self.pristine[i][len..]
    }

    pub fn work(&self, i: usize) -> &[u8] {
        &self.work[i]
    }

    /// One pass, burst by burst: restore the burst, then hand each packet to `f` (which
    /// the compiler inlines here, so there is no call per packet beyond what `f` calls).
    #[inline(never)]
    pub fn pass(&mut self, mut f: impl FnMut(usize, &mut [u8])) {
        for start in (0..self.len()).step_by(BURST) {
            let end = (start + BURST).min(self.len());
            self.restore_burst(start, end);
            for i in start..end {
                f(i, &mut self.work[i]);
            }
        }
    }

    /// One pass, burst by burst: restore the burst, then hand the whole burst to `f` (for
    /// `Worker::process_batch`, as the receive loop calls it).
    #[inline(never)]
    pub fn pass_bursts(&mut self, mut f: impl FnMut(&mut [Vec<u8>])) {
        for start in (0..self.len()).step_by(BURST) {
            let end = (start + BURST).min(self.len());
            self.restore_burst(start, end);
            f(&mut self.work[start..end]);
        }
    }

    /// Restores packets `start..end` and returns their buffers.
    pub fn restored_burst(&mut self, start: usize, end: usize) -> &mut [Vec<u8>] {
        self.restore_burst(start, end);
        &mut self.work[start..end]
    }

    /// A pass that only restores: the baseline subtracted from every packet figure.
    #[inline(never)]
    pub fn restore_pass(&mut self) {
        for start in (0..self.len()).step_by(BURST) {
            let end = (start + BURST).min(self.len());
            self.restore_burst(start, end);
            for i in start..end {
                black_box(&mut self.work[i]);
            }
        }
    }

    #[inline(always)]
    fn restore_burst(&mut self, start: usize, end: usize) {
        for i in start..end {
            black_box(self.restored(i));
        }
    }
}
