//! The price of the keyed PRF: SipHash-1-3 beside a table-driven Toeplitz hash.
//!
//! Cheetah hashes every packet's connection id with a keyed SipHash so that clients cannot
//! forge cookies; the NIC's Toeplitz (RSS) hash would be nearly free but is public and
//! linear. Both are timed on the trace's connection ids two ways: independent hashes
//! (throughput, how a batch of packets overlaps them) and a dependent chain, where each
//! input depends on the previous hash (latency, what one packet waits for). The chain adds
//! an AND and an XOR per hash to both sides.

use std::hint::black_box;

use cheetah_core::hash::toeplitz::{Toeplitz, MICROSOFT_KEY};
use cheetah_core::hash::{FlowHasher, FlowKey};

use super::items::Path;
use super::timing::{Pass, Timed};

pub struct HashBench {
    keys: Vec<FlowKey>,
    siphash: FlowHasher,
    toeplitz: Toeplitz,
    /// [`Path::Siphash`] or [`Path::Toeplitz`].
    path: Path,
    /// Time a dependent chain (latency) instead of independent hashes (throughput).
    chained: bool,
}

#[inline(always)]
fn toeplitz_of(t: &Toeplitz, k: &FlowKey) -> u64 {
    t.hash_ipv4_tcp(k.client_ip, k.vip_ip, k.client_port, k.vip_port) as u64
}

/// One SipHash, never inlined, for callgrind.
#[inline(never)]
pub fn measured_siphash(hasher: &FlowHasher, key: &FlowKey) -> u64 {
    hasher.hash(key)
}

/// One Toeplitz hash, never inlined, for callgrind.
#[inline(never)]
pub fn measured_toeplitz(toeplitz: &Toeplitz, key: &FlowKey) -> u64 {
    toeplitz_of(toeplitz, key)
}

impl HashBench {
    pub fn new(keys: Vec<FlowKey>, siphash: FlowHasher, path: Path, chained: bool) -> Self {
        HashBench {
            keys,
            siphash,
            toeplitz: Toeplitz::new(&MICROSOFT_KEY),
            path,
            chained,
        }
    }

    pub fn run_for_instructions(&self, hashes: u64) {
        let n = self.keys.len();
        for i in 0..hashes as usize {
            let key = &self.keys[i % n];
            black_box(match self.path {
                Path::Siphash => measured_siphash(&self.siphash, key),
                _ => measured_toeplitz(&self.toeplitz, key),
            });
        }
    }
}

impl Timed for HashBench {
    fn items(&self) -> usize {
        self.keys.len()
    }

    /// The baseline is the bare loop over the keys.
    fn pass(&mut self, pass: Pass) {
        let (sip, toe) = (&self.siphash, &self.toeplitz);
        let hash = |k: &FlowKey| match self.path {
            Path::Siphash => sip.hash(k),
            _ => toeplitz_of(toe, k),
        };
        match (pass, self.chained) {
            (Pass::Baseline, _) => {
                for k in &self.keys {
                    black_box(k);
                }
            }
            (Pass::Work, false) => {
                for k in &self.keys {
                    black_box(hash(black_box(k)));
                }
            }
            (Pass::Work, true) => {
                let mut h = 0u64;
                for k in &self.keys {
                    let mut key = *black_box(k);
                    key.client_port ^= (h & 1) as u16;
                    h = hash(&key);
                }
                black_box(h);
            }
        }
    }
}
