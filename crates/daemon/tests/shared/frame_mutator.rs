//! Seeded mutations of Ethernet frames for the differential runner (xdp_differential.rs):
//! blind ones (bit flips, interesting bytes, truncation, extension, splices) and ones aware
//! of the fields the in-kernel fast path reads (EtherType, IHL, fragment bits, protocol,
//! total length, data offset, TCP flags, option bytes, the timestamps' high halves, ports,
//! addresses and MACs drawn from the configured VIPs, servers and interfaces). Checksums
//! are left as the mutation leaves them: neither the kernel nor the core verifies one, and
//! both must carry a wrong one on exactly as wrong (included by path, `#[path]`).

use rand_core::RngCore;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::xdp_kernel::l3_offset;

/// The values field-aware mutations draw from: what the LB's maps and config know, so that
/// a mutated frame still reaches the paths that look them up.
#[derive(Default)]
pub struct Dictionary {
    pub addrs: Vec<[u8; 4]>,
    pub ports: Vec<u16>,
    pub macs: Vec<[u8; 6]>,
}

const ETH: usize = 14;

const INTERESTING: [u8; 14] = [
    0x00, 0xff, 0x01, 0x7f, 0x80, 0x08, 0x0a, 0x02, 0x10, 0x12, 0x11, 0x04, 0x14, 0x05,
];
const SEQUENCES: [&[u8]; 8] = [
    &[0x01, 0x01, 0x08, 0x0a],
    &[0x08, 0x0a],
    &[0x08, 0x00],
    &[0x86, 0xdd],
    &[0x81, 0x00, 0x00, 0x01],
    &[0x00, 0x00, 0x00, 0x00],
    &[0xff, 0xff, 0xff, 0xff],
    &[0x02, 0x04, 0x05, 0xb4],
];
const TCP_FLAGS: [u8; 12] = [
    0x10, 0x02, 0x12, 0x11, 0x04, 0x14, 0x18, 0x30, 0x00, 0x01, 0x50, 0xd0,
];

pub struct Mutator<'a> {
    pub rng: Xoshiro256PlusPlus,
    pub dictionary: &'a Dictionary,
}

impl Mutator<'_> {
    pub fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn pick<T: Copy>(&mut self, values: &[T]) -> T {
        values[self.below(values.len())]
    }

    fn byte(&mut self) -> u8 {
        self.rng.next_u64() as u8
    }

    /// Applies one to four mutations (the names of what was done, for the failure report).
    pub fn mutate(&mut self, frame: &mut Vec<u8>, others: &[Vec<u8>]) -> Vec<&'static str> {
        let count = 1 + self.below(2) + self.below(2) * self.below(2) * 2;
        (0..count)
            .map(|_| self.mutate_once(frame, others))
            .collect()
    }

    fn mutate_once(&mut self, frame: &mut Vec<u8>, others: &[Vec<u8>]) -> &'static str {
        // Past any VLAN tags, as the LB reads the frame.
        let l3 = l3_offset(frame);
        let ip = frame.len() >= l3 + 20;
        let l4 = if ip {
            l3 + usize::from(frame[l3] & 0x0f) * 4
        } else {
            usize::MAX
        };
        let tcp = l4 != usize::MAX && frame.len() >= l4 + 20;
        let len = frame.len();
        match self.below(24) {
            0 | 1 => {
                let at = self.below(len);
                frame[at] ^= 1 << self.below(8);
                "bit flip"
            }
            2 | 3 => {
                let at = self.below(len);
                frame[at] = self.pick(&INTERESTING);
                "interesting byte"
            }
            4 => {
                let sequence = self.pick(&SEQUENCES);
                let at = self.below(len);
                for (n, b) in sequence.iter().enumerate() {
                    if let Some(slot) = frame.get_mut(at + n) {
                        *slot = *b;
                    }
                }
                "interesting sequence"
            }
            5 => {
                let cut = match (tcp, self.below(3)) {
                    (true, 0) => l4 + 20 + self.below(16),
                    (true, 1) => l4 + self.below(20),
                    _ => ETH + self.below(len.saturating_sub(ETH).max(1)),
                };
                frame.truncate(cut.clamp(ETH, len));
                "truncate"
            }
            6 => {
                let extra = 1 + self.below(64);
                let fill = if self.chance(2) { 0 } else { self.byte() };
                frame.extend(std::iter::repeat_n(fill, extra));
                "extend"
            }
            7 => {
                let ethertype = self.pick(&[0x0800u16, 0x86dd, 0x0806, 0x8100, 0x88a8]);
                let ethertype = if self.chance(5) {
                    self.rng.next_u64() as u16
                } else {
                    ethertype
                };
                frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
                "ethertype"
            }
            8 if ip => {
                let version = if self.chance(8) { 6 } else { 4 };
                let ihl = self.pick(&[4u8, 5, 5, 6, 7, 15, 0, 3]);
                frame[l3] = version << 4 | ihl;
                "ihl"
            }
            9 if ip => {
                let frag: u16 = self.pick(&[0x2000, 0x4000, 0x0001, 0x2001, 0x1fff, 0x8000]);
                let value = if self.chance(2) {
                    frag
                } else {
                    u16::from_be_bytes([frame[l3 + 6], frame[l3 + 7]]) ^ frag
                };
                frame[l3 + 6..l3 + 8].copy_from_slice(&value.to_be_bytes());
                "frag bits"
            }
            10 if ip => {
                frame[l3 + 9] = self.pick(&[6u8, 6, 17, 1, 0, 255, 58]);
                "protocol"
            }
            11 if ip => {
                let total = u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]);
                let total = match self.below(5) {
                    0 => (len - l3) as u16,
                    1 => total.wrapping_add(1 + self.below(8) as u16),
                    2 => total.wrapping_sub(1 + self.below(8) as u16),
                    3 => self.pick(&[0u16, 20, 40, 52, 0xffff]),
                    _ => self.rng.next_u64() as u16,
                };
                frame[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
                "tot_len"
            }
            12 if tcp => {
                let doff = self.pick(&[0u8, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15]);
                frame[l4 + 12] = doff << 4 | (frame[l4 + 12] & 0x0f);
                "doff"
            }
            13 if tcp => {
                frame[l4 + 13] = if self.chance(4) {
                    self.byte()
                } else {
                    self.pick(&TCP_FLAGS)
                };
                "tcp flags"
            }
            14 if tcp && len > l4 + 20 => {
                let at = l4 + 20 + self.below(len - l4 - 20).min(39);
                if at < len {
                    frame[at] = if self.chance(2) {
                        self.pick(&[0u8, 1, 2, 3, 4, 5, 8, 10, 12, 0xff])
                    } else {
                        self.byte()
                    };
                }
                "option byte"
            }
            15 | 16 if tcp => match timestamp_at(frame, l4) {
                Some(ts) => {
                    // TSval's or TSecr's high half: the MSB a reply carries, the cookie a
                    // client echoes.
                    let half = ts + if self.chance(2) { 0 } else { 4 };
                    let old = u16::from_be_bytes([frame[half], frame[half + 1]]);
                    let new = match self.below(5) {
                        0 => old.wrapping_add(1),
                        1 => old.wrapping_sub(1),
                        2 => old ^ (1 << self.below(16)),
                        3 => self.pick(&[0u16, 0xffff, 0x8000, 0x0001]),
                        _ => self.rng.next_u64() as u16,
                    };
                    frame[half..half + 2].copy_from_slice(&new.to_be_bytes());
                    "timestamp high half"
                }
                None => {
                    // Give it the layout the fast path takes: NOP NOP TS at the options'
                    // start, TCP header 32 bytes.
                    if len >= l4 + 32 {
                        frame[l4 + 12] = 8 << 4 | (frame[l4 + 12] & 0x0f);
                        frame[l4 + 20..l4 + 24].copy_from_slice(&[1, 1, 8, 10]);
                    }
                    "nop nop ts"
                }
            },
            17 if tcp => {
                let which = l4 + 2 * self.below(2);
                let port = if self.chance(4) || self.dictionary.ports.is_empty() {
                    self.rng.next_u64() as u16
                } else {
                    self.pick(&self.dictionary.ports)
                };
                frame[which..which + 2].copy_from_slice(&port.to_be_bytes());
                "port"
            }
            18 | 19 if ip => {
                let which = l3 + 12 + 4 * self.below(2);
                let addr = if self.chance(5) || self.dictionary.addrs.is_empty() {
                    (self.rng.next_u64() as u32).to_be_bytes()
                } else {
                    self.pick(&self.dictionary.addrs)
                };
                frame[which..which + 4].copy_from_slice(&addr);
                "address"
            }
            20 => {
                let which = 6 * self.below(2);
                let mac = if self.chance(5) || self.dictionary.macs.is_empty() {
                    let mut mac = [0u8; 6];
                    mac.iter_mut().for_each(|b| *b = self.byte());
                    mac
                } else {
                    self.pick(&self.dictionary.macs)
                };
                frame[which..which + 6].copy_from_slice(&mac);
                "mac"
            }
            21 if !others.is_empty() => {
                let other = &others[self.below(others.len())];
                let at = self.below(len);
                let from = self.below(other.len());
                let n = (1 + self.below(16)).min(len - at).min(other.len() - from);
                frame[at..at + n].copy_from_slice(&other[from..from + n]);
                "splice"
            }
            _ => {
                let at = self.below(len);
                frame[at] = self.byte();
                "random byte"
            }
        }
    }
}

/// Where the timestamp option's TSval starts, if the options hold one (TSecr follows).
fn timestamp_at(frame: &[u8], l4: usize) -> Option<usize> {
    let end = (l4 + usize::from(frame[l4 + 12] >> 4) * 4).min(frame.len());
    let mut at = l4 + 20;
    while at + 1 < end {
        match frame[at] {
            0 => return None,
            1 => at += 1,
            8 if frame[at + 1] == 10 && at + 10 <= end => return Some(at + 2),
            _ => {
                let step = usize::from(frame[at + 1]);
                if step < 2 {
                    return None;
                }
                at += step;
            }
        }
    }
    None
}
