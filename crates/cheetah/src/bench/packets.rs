//! The packets of one path: each in its own buffer, restored from a pristine copy before
//! every use.
//!
//! The pipeline rewrites packets in place (MAC, TSval/TSecr, checksum), so a buffer must be
//! put back as it arrived before it is processed again, or the second pass would measure
//! already-rewritten packets (and in cheetah mode route by a restored TSecr, i.e. garbage).
//! Only the headers are copied back by default: the pipeline never writes past the TCP
//! header, which [`PacketSet::payload_untouched`] checks for every packet before timing,
//! and copying 1448-byte payloads would bury the figure under memcpy noise.

use std::hint::black_box;

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

    /// One pass: restore each packet and hand it to `f` (which the compiler inlines here,
    /// so a pass is one loop with no call per packet beyond what `f` itself calls).
    #[inline(never)]
    pub fn pass(&mut self, mut f: impl FnMut(usize, &mut [u8])) {
        for i in 0..self.len() {
            let packet = self.restored(i);
            f(i, packet);
        }
    }

    /// A pass that only restores: the baseline subtracted from every packet figure.
    #[inline(never)]
    pub fn restore_pass(&mut self) {
        for i in 0..self.len() {
            black_box(self.restored(i));
        }
    }
}
