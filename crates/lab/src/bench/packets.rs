//! The packets of one path, written into a receive ring of recycled frames before every
//! use.
//!
//! The pipeline rewrites packets in place (MAC, TSval/TSecr, checksum), so a frame must be
//! written as the packet arrived before it is processed, or a second pass would measure
//! already-rewritten packets (and in cheetah mode route by a restored TSecr, i.e. garbage).
//! Only the headers are written by default: the pipeline never writes past the TCP header,
//! which the checking pass verifies for every packet on a whole-frame copy, and copying
//! 1448-byte payloads would bury the figure under memcpy noise.
//!
//! The frames are a ring, as a NIC's receive ring or an AF_XDP UMEM is: packet `i` is
//! written into frame `i % ring`, so a burst's packets each have a buffer of their own and
//! the ring's frames are reused pass after pass. With one buffer per packet instead
//! (`--ring-frames 0`) the path's working set is the whole trace: 57,000 server packets of
//! 1.5 KB each, twice (pristine and work), 170 MB that no receive path ever has in flight,
//! and the figure measures the harness's TLB and cache misses. The pristine headers are
//! kept packed, back to back, for the same reason.
//!
//! Passes go in bursts of [`BURST`] packets, as a DPDK or AF_XDP receive loop does: write
//! a burst (the "NIC" does), then process it. Writing one packet and processing it
//! straight after would let the writes' cache misses stall the processing in the timed
//! pass but overlap one another in the restore-only pass, so the subtraction would charge
//! the harness's memory traffic to the pipeline. In bursts, both passes run the same
//! restore phase, and the processing finds the burst's headers in L1, as after a real
//! receive burst.

use std::hint::black_box;

/// Packets restored, then processed, at a time (a typical receive burst).
pub const BURST: usize = 32;

/// Default frames in the receive ring: a common NIC ring and AF_XDP fill ring size.
pub const DEFAULT_RING_FRAMES: usize = 4096;

pub struct PacketSet {
    /// Each packet as it arrived, for whole-frame restores and the checks.
    pristine: Vec<Vec<u8>>,
    /// The bytes each restore writes (headers, or whole frames), packed back to back.
    packed: Vec<u8>,
    /// Where packet `i`'s restore bytes start in `packed`; `packed_at[i + 1]` is the end.
    packed_at: Vec<usize>,
    /// The receive ring; packet `i` lives in frame `i % frames.len()`.
    frames: Vec<Box<[u8]>>,
}

/// End of the TCP header of an untagged IPv4/TCP frame (what the trace holds).
fn headers_len(frame: &[u8]) -> usize {
    let l4 = 14 + (frame[14] & 0x0f) as usize * 4;
    l4 + (frame[l4 + 12] >> 4) as usize * 4
}

impl PacketSet {
    /// `ring_frames` frames in the receive ring (rounded up to whole bursts, at most one
    /// per packet); 0 gives every packet a frame of its own.
    pub fn new<'a>(
        frames: impl IntoIterator<Item = &'a [u8]>,
        full_restore: bool,
        ring_frames: usize,
    ) -> Self {
        let pristine: Vec<Vec<u8>> = frames.into_iter().map(<[u8]>::to_vec).collect();
        let mut packed = Vec::new();
        let mut packed_at = vec![0];
        for frame in &pristine {
            let len = if full_restore {
                frame.len()
            } else {
                headers_len(frame)
            };
            packed.extend_from_slice(&frame[..len]);
            packed_at.push(packed.len());
        }
        let ring = match ring_frames {
            0 => pristine.len(),
            n => n.div_ceil(BURST).saturating_mul(BURST).min(pristine.len()),
        };
        let frame_size = pristine.iter().map(Vec::len).max().unwrap_or(0);
        let mut set = PacketSet {
            frames: (0..ring)
                .map(|_| vec![0u8; frame_size].into_boxed_slice())
                .collect(),
            pristine,
            packed,
            packed_at,
        };
        for i in 0..set.len() {
            set.restored_whole(i);
        }
        set
    }

    pub fn len(&self) -> usize {
        self.pristine.len()
    }

    /// Mean bytes copied back per packet.
    pub fn mean_restore_bytes(&self) -> f64 {
        self.packed.len() as f64 / self.len().max(1) as f64
    }

    /// Packet `i`'s frame in the ring `frames`, cut to the packet's `len` (a free function
    /// of the field, so that callers can read the other fields while holding it).
    #[inline(always)]
    fn frame_in(frames: &mut [Box<[u8]>], i: usize, len: usize) -> &mut [u8] {
        let ring = frames.len();
        &mut frames[i % ring][..len]
    }

    #[inline(always)]
    fn frame(&mut self, i: usize) -> &mut [u8] {
        Self::frame_in(&mut self.frames, i, self.pristine[i].len())
    }

    /// Writes packet `i`'s restore bytes into its frame and returns the packet. Past them
    /// the frame holds whatever an earlier packet left, which the pipeline never reads.
    #[inline(always)]
    pub fn restored(&mut self, i: usize) -> &mut [u8] {
        let (start, end) = (self.packed_at[i], self.packed_at[i + 1]);
        let frame = Self::frame_in(&mut self.frames, i, self.pristine[i].len());
        frame[..end - start].copy_from_slice(&self.packed[start..end]);
        frame
    }

    /// Writes the whole of packet `i` into its frame (for the checking pass).
    pub fn restored_whole(&mut self, i: usize) -> &mut [u8] {
        let frame = Self::frame_in(&mut self.frames, i, self.pristine[i].len());
        frame.copy_from_slice(&self.pristine[i]);
        frame
    }

    /// Whether everything past the restore bytes of packet `i` is still as it arrived
    /// (meaningful after [`restored_whole`](Self::restored_whole) and one processing).
    pub fn payload_untouched(&mut self, i: usize) -> bool {
        let restored = self.packed_at[i + 1] - self.packed_at[i];
        let pristine = &self.pristine[i];
        Self::frame_in(&mut self.frames, i, pristine.len())[restored..] == pristine[restored..]
    }

    /// Packet `i` as its frame holds it now.
    pub fn work(&mut self, i: usize) -> &[u8] {
        self.frame(i)
    }

    /// One pass, burst by burst: restore the burst, then hand each packet to `f` (which
    /// the compiler inlines here, so there is no call per packet beyond what `f` calls).
    #[inline(never)]
    pub fn pass(&mut self, mut f: impl FnMut(usize, &mut [u8])) {
        for start in (0..self.len()).step_by(BURST) {
            let end = (start + BURST).min(self.len());
            self.restore_burst(start, end);
            for i in start..end {
                f(i, self.frame(i));
            }
        }
    }

    /// One pass, burst by burst: restore the burst, then hand the whole burst to `f` (for
    /// `Worker::process_batch`, as the receive loop calls it).
    #[inline(never)]
    pub fn pass_bursts(&mut self, mut f: impl FnMut(&mut dyn Iterator<Item = &mut [u8]>)) {
        for start in (0..self.len()).step_by(BURST) {
            let end = (start + BURST).min(self.len());
            f(&mut self.restored_burst(start, end));
        }
    }

    /// Restores packets `start..end` (within one burst) and returns them in order.
    #[inline(always)]
    pub fn restored_burst(
        &mut self,
        start: usize,
        end: usize,
    ) -> impl Iterator<Item = &mut [u8]> + '_ {
        self.restore_burst(start, end);
        // The ring is whole bursts and every burst starts on a multiple of BURST, so a
        // burst's frames are contiguous in the ring.
        let ring = self.frames.len();
        let first = start % ring;
        self.frames[first..first + (end - start)]
            .iter_mut()
            .zip(&self.pristine[start..end])
            .map(|(frame, pristine)| &mut frame[..pristine.len()])
    }

    /// A pass that only restores: the baseline subtracted from every packet figure.
    #[inline(never)]
    pub fn restore_pass(&mut self) {
        for start in (0..self.len()).step_by(BURST) {
            let end = (start + BURST).min(self.len());
            self.restore_burst(start, end);
            for i in start..end {
                black_box(self.frame(i));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An untagged IPv4/TCP frame whose payload bytes are all `fill`.
    fn frame(fill: u8, payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload];
        f[14] = 0x45;
        f[14 + 20 + 12] = 5 << 4;
        f[14 + 40..].fill(fill);
        f[0] = fill;
        f
    }

    #[test]
    fn a_ring_smaller_than_the_set_recycles_frames_and_restores_headers() {
        let frames: Vec<Vec<u8>> = (0..100).map(|i| frame(i as u8, 10 + i)).collect();
        let mut set = PacketSet::new(frames.iter().map(|f| &f[..]), false, 40);
        assert_eq!(set.frames.len(), 64);
        for (i, frame) in frames.iter().enumerate() {
            let packet = set.restored(i);
            assert_eq!(packet.len(), frame.len());
            assert_eq!(packet[..54], frame[..54]);
        }
        set.restored_whole(70);
        assert!(set.payload_untouched(70));
        assert_eq!(set.work(70), &frames[70][..]);
    }

    #[test]
    fn bursts_hand_out_each_packet_once_in_order() {
        let frames: Vec<Vec<u8>> = (0..70).map(|i| frame(i as u8, 3)).collect();
        for ring in [0, 32, 4096] {
            let mut set = PacketSet::new(frames.iter().map(|f| &f[..]), false, ring);
            let mut seen = Vec::new();
            set.pass_bursts(|burst| seen.extend(burst.map(|p| p[0])));
            assert_eq!(
                seen,
                (0..70).map(|i| i as u8).collect::<Vec<_>>(),
                "ring {ring}"
            );
        }
    }
}
