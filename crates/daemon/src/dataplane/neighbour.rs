//! Asks the kernel to resolve a neighbour the FIB lookup found missing.
//!
//! The XDP program reads next hops from the kernel's neighbour table but cannot create
//! entries. An `RTM_NEWNEIGH` with `NTF_USE` makes the kernel start ARP for the address,
//! as if it had a packet to send there; the next packets then find the entry. One netlink
//! message, so it is written here rather than pulling in a netlink crate.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cheetah_core::types::Nanos;

const RTM_NEWNEIGH: u16 = 28;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
const NTF_USE: u8 = 0x1;
const NUD_NONE: u16 = 0x0;
const NDA_DST: u16 = 1;
/// At most one request per this many nanoseconds per worker: a burst of replies toward an
/// unresolved client must not turn into a burst of netlink messages.
const MIN_GAP: Nanos = 50_000_000;

pub struct NeighbourResolver {
    socket: Option<OwnedFd>,
    last: Option<Nanos>,
}

impl Default for NeighbourResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl NeighbourResolver {
    pub fn new() -> Self {
        // SAFETY: plain socket(2); the fd is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        NeighbourResolver {
            socket: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
            last: None,
        }
    }

    pub fn request(&mut self, ifindex: u32, addr: [u8; 4], now: Nanos) {
        if self
            .last
            .is_some_and(|last| now.saturating_sub(last) < MIN_GAP)
        {
            return;
        }
        self.last = Some(now);
        let Some(socket) = &self.socket else { return };
        let message = new_neigh_message(ifindex, addr);
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sending a fully initialised buffer to the kernel's netlink address.
        unsafe {
            libc::sendto(
                socket.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                libc::MSG_DONTWAIT,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            );
            // Drain error replies so the receive buffer never fills.
            let mut sink = [0u8; 512];
            while libc::recv(
                socket.as_raw_fd(),
                sink.as_mut_ptr().cast(),
                sink.len(),
                libc::MSG_DONTWAIT,
            ) > 0
            {}
        }
    }
}

fn new_neigh_message(ifindex: u32, addr: [u8; 4]) -> [u8; 36] {
    let mut m = [0u8; 36];
    // nlmsghdr
    m[0..4].copy_from_slice(&36u32.to_ne_bytes());
    m[4..6].copy_from_slice(&RTM_NEWNEIGH.to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE).to_ne_bytes());
    // ndmsg: family, pad, pad, ifindex, state, flags, type
    m[16] = libc::AF_INET as u8;
    m[20..24].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    m[24..26].copy_from_slice(&NUD_NONE.to_ne_bytes());
    m[26] = NTF_USE;
    // rtattr NDA_DST
    m[28..30].copy_from_slice(&8u16.to_ne_bytes());
    m[30..32].copy_from_slice(&NDA_DST.to_ne_bytes());
    m[32..36].copy_from_slice(&addr);
    m
}
