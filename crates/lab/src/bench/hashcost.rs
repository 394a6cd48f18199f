//! The price of the keyed PRF: SipHash-1-3 beside a table-driven Toeplitz hash.
//!
//! Cheetah hashes every packet's connection id with a keyed SipHash so that clients cannot
//! forge cookies; the NIC's Toeplitz (RSS) hash would be nearly free but is public and
//! linear. SipHash is timed as the per-packet paths pay it: finishing the VIP's prefix
//! (the state after the VIP's word, kept per snapshot) with the client's word. Both are
//! timed on the trace's connection ids two ways: independent hashes
//! (throughput, how a batch of packets overlaps them) and a dependent chain, where each
//! input depends on the previous hash (latency, what one packet waits for). The chain adds
//! an AND and an XOR per hash to both sides.

use std::hint::black_box;

use cheetah_core::hash::toeplitz::{Toeplitz, MICROSOFT_KEY};
use cheetah_core::hash::{FlowHasher, FlowKey, VipHashPrefix};

use super::items::Path;
use super::timing::{Pass, Timed};

pub struct HashBench {
    keys: Vec<FlowKey>,
    /// The prefix of the trace's one VIP.
    siphash: VipHashPrefix,
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

#[inline(always)]
fn siphash_of(prefix: &VipHashPrefix, k: &FlowKey) -> u64 {
    prefix.finish(k.client_ip, k.client_port)
}

/// One SipHash, never inlined, for callgrind.
#[inline(never)]
pub fn measured_siphash(prefix: &VipHashPrefix, key: &FlowKey) -> u64 {
    siphash_of(prefix, key)
}

/// One Toeplitz hash, never inlined, for callgrind.
#[inline(never)]
pub fn measured_toeplitz(toeplitz: &Toeplitz, key: &FlowKey) -> u64 {
    toeplitz_of(toeplitz, key)
}

impl HashBench {
    pub fn new(keys: Vec<FlowKey>, hasher: &FlowHasher, path: Path, chained: bool) -> Self {
        let vip_side = |k: &FlowKey| (k.vip_ip, k.vip_port, k.protocol);
        let (vip_ip, vip_port, protocol) = vip_side(&keys[0]);
        assert!(
            keys.iter()
                .all(|k| vip_side(k) == (vip_ip, vip_port, protocol)),
            "the hash rows assume the trace's one VIP"
        );
        HashBench {
            siphash: hasher.vip_prefix(vip_ip, vip_port, protocol),
            keys,
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
            Path::Siphash => siphash_of(sip, k),
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
