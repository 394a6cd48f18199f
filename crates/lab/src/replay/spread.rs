//! Which worker a packet goes to, the way the NIC would pick the receive queue.
//!
//! The LB's workers each own state the pipeline writes (policy cursors, the no-timestamp
//! LRU, rate limiters), so a multi-worker replay only says what production would do if
//! packets meet the workers they would meet there. Production spreads them with RSS and a
//! symmetric Toeplitz key, so that both directions of a flow land on one queue; the replay
//! does the same: Toeplitz with [`SYMMETRIC_KEY`](cheetah_core::hash::toeplitz::SYMMETRIC_KEY)
//! over the IPv4 4-tuple (addresses only for fragments and for protocols without ports),
//! then the NIC's default 128-entry indirection table (`entry i -> queue i % workers`).
//! What the NIC cannot parse (ARP, IPv6 here, runts) has hash 0 and goes to worker 0.
//!
//! In NAT mode a server's reply comes from its DIP, not the VIP, so it hashes differently
//! from the client's packets and may meet another worker, exactly as it would under RSS.

use cheetah_core::hash::toeplitz::Toeplitz;
use cheetah_core::wire::ethernet::ethertype;
use cheetah_core::wire::{ip_proto, EthernetFrame, Ipv4Packet};

/// Entries of the NIC's RSS indirection table (RETA); ethtool's default fills entry `i`
/// with queue `i % queues`.
pub const RETA_SIZE: usize = 128;

pub struct Spreader {
    /// `None` with a single worker: there is nothing to choose, so no hashing at all.
    toeplitz: Option<Toeplitz>,
    workers: usize,
}

impl Spreader {
    pub fn new(workers: usize) -> Self {
        let workers = workers.max(1);
        Spreader {
            toeplitz: (workers > 1).then(Toeplitz::symmetric),
            workers,
        }
    }

    /// The worker (receive queue) that gets `frame`.
    pub fn worker_for(&self, frame: &[u8]) -> usize {
        match &self.toeplitz {
            None => 0,
            Some(toeplitz) => {
                let hash = rss_hash(toeplitz, frame).unwrap_or(0);
                (hash as usize % RETA_SIZE) % self.workers
            }
        }
    }
}

/// The RSS hash a NIC computes for `frame`, or `None` where it computes none.
fn rss_hash(toeplitz: &Toeplitz, frame: &[u8]) -> Option<u32> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ethertype::IPV4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(&frame[eth.payload_offset()..]).ok()?;
    let has_ports = matches!(ip.protocol(), ip_proto::TCP | ip_proto::UDP) && !ip.is_fragment();
    match ip.payload() {
        [a, b, c, d, ..] if has_ports => Some(toeplitz.hash_ipv4_tcp(
            ip.src(),
            ip.dst(),
            u16::from_be_bytes([*a, *b]),
            u16::from_be_bytes([*c, *d]),
        )),
        _ => Some(toeplitz.hash_ipv4_addrs(ip.src(), ip.dst())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cheetah_core::testkit::{self, options, TcpFrame};
    use cheetah_core::wire::tcp::flags;

    #[test]
    fn both_directions_of_a_flow_meet_one_worker_and_flows_spread() {
        let spreader = Spreader::new(4);
        let mut seen = [false; 4];
        for n in 0..64 {
            // Address and port vary independently: with the symmetric key, bytes 16 bits
            // apart weigh alike, so varying both in step would cancel out.
            let client = testkit::client_ip(n * 37 + 1);
            let port = 33_000 + 101 * n as u16;
            let syn = TcpFrame::from_client(client, port, flags::SYN, options::linux_syn(1, 0));
            let reply = TcpFrame::from_server_l2(
                1,
                client,
                port,
                flags::SYN | flags::ACK,
                options::linux_syn(2, 1),
            );
            let worker = spreader.worker_for(&syn.build());
            assert_eq!(worker, spreader.worker_for(&reply.build()), "flow {n}");
            seen[worker] = true;
        }
        assert_eq!(seen, [true; 4]);
    }

    #[test]
    fn frames_without_a_hash_go_to_worker_zero() {
        let spreader = Spreader::new(3);
        assert_eq!(spreader.worker_for(&[0u8; 10]), 0);
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(spreader.worker_for(&arp), 0);
        assert_eq!(Spreader::new(1).worker_for(&arp), 0);
    }
}
