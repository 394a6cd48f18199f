//! The live bench's second sender, for kernels that refuse BPF_PROG_TEST_RUN's live-frames
//! mode (EPERM: some hardened builds do): an AF_PACKET socket on the sender's veth with a
//! transmit ring (PACKET_TX_RING, TPACKET_V2), past the qdisc (PACKET_QDISC_BYPASS), as
//! `trafgen` from netsniff-ng sends. The frames are written into the ring once; each round
//! marks a batch of slots for sending and one `send` has the kernel transmit them all.
//! Each frame reaches the LB's end as an skb that the veth converts for XDP, a cost both
//! runs (the reflector and cheetah_lb) pay alike on the LB's CPU.
//!
//! Hand-written rather than driving `trafgen`: the bench pauses and resumes its sender
//! between readings of the counters and counts what it offered, which an external process
//! would make a matter of signals and output parsing; the loop is a few system calls.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, ensure, Context};

/// Slots marked for sending per `send`.
pub(super) const BATCH: usize = 256;
/// The ring: slots of `SLOT` bytes, `SLOTS_PER_BLOCK` to a page-sized block.
const SLOT: usize = 256;
const BLOCK: usize = 4096;
const SLOTS_PER_BLOCK: usize = BLOCK / SLOT;
const BLOCKS: usize = 64;
const SLOTS: usize = BLOCKS * SLOTS_PER_BLOCK;
/// Where a TPACKET_V2 slot's frame starts: its header, aligned (TPACKET2_HDRLEN less the
/// sockaddr_ll the kernel accounts for on receive).
const DATA_AT: usize = 32;
const TPACKET_V2: libc::c_int = 1;

pub(super) struct PacketSender {
    socket: OwnedFd,
    ring: *mut u8,
    next: usize,
}

// SAFETY: the ring is this sender's alone; it moves with it to the sender's thread.
unsafe impl Send for PacketSender {}

impl PacketSender {
    /// A socket on `ifindex` of the calling thread's network namespace whose ring holds
    /// `frames` (all of one length) round robin; it receives nothing (protocol 0).
    pub(super) fn open(ifindex: u32, frames: &[Vec<u8>]) -> anyhow::Result<Self> {
        let frame_len = frames[0].len();
        ensure!(
            frame_len <= SLOT - DATA_AT && frames.iter().all(|f| f.len() == frame_len),
            "the sender's frames must all be {frame_len} bytes and at most {}",
            SLOT - DATA_AT
        );
        // SAFETY: plain socket(2); the descriptor is owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("cannot open an AF_PACKET socket");
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        set_option(fd, libc::PACKET_VERSION, &TPACKET_V2, "PACKET_VERSION")?;
        set_option(fd, libc::PACKET_QDISC_BYPASS, &1, "PACKET_QDISC_BYPASS")?;
        // Room for the whole ring in flight (root may exceed net.core.wmem_max).
        let send_buffer = (SLOTS * 2048) as libc::c_int;
        set_option_at(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &send_buffer,
            "SO_SNDBUFFORCE",
        )?;
        let request = libc::tpacket_req {
            tp_block_size: BLOCK as u32,
            tp_block_nr: BLOCKS as u32,
            tp_frame_size: SLOT as u32,
            tp_frame_nr: SLOTS as u32,
        };
        set_option(fd, libc::PACKET_TX_RING, &request, "PACKET_TX_RING")?;
        // SAFETY: zeroed is a valid sockaddr_ll; the fields set make it the device's.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_ifindex = ifindex as i32;
        // SAFETY: `address` is a sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd,
                (&address as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot bind the AF_PACKET socket to ifindex {ifindex}"));
        }
        // SAFETY: maps the ring the kernel just made for this socket, of its size.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCKS * BLOCK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("cannot map the transmit ring");
        }
        let sender = PacketSender {
            socket,
            ring: ring.cast(),
            next: 0,
        };
        for slot in 0..SLOTS {
            let frame = &frames[slot % frames.len()];
            // SAFETY: inside the mapped ring (slot < SLOTS, DATA_AT + len <= SLOT).
            unsafe {
                let at = sender.ring.add(slot * SLOT);
                std::ptr::copy_nonoverlapping(frame.as_ptr(), at.add(DATA_AT), frame_len);
                (*at.cast::<libc::tpacket2_hdr>()).tp_len = frame_len as u32;
            }
        }
        Ok(sender)
    }

    /// Marks the next batch of free slots for sending and has the kernel send them: how
    /// many slots it marked. A slot the kernel has not sent yet (a signal, the bench
    /// pausing its sender, ended the call; the device queue was full) goes with the next
    /// call, and what the bench counts as offered is read once everything has drained.
    pub(super) fn send_batch(&mut self) -> anyhow::Result<u64> {
        let mut marked = 0;
        for _ in 0..BATCH {
            let status = self.status(self.next);
            if status.load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE {
                break;
            }
            status.store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.next = (self.next + 1) % SLOTS;
            marked += 1;
        }
        // Without MSG_DONTWAIT the call would wait until the LB's end had freed every
        // frame it sent, leaving the sender idle for that time.
        // SAFETY: no buffer: the kernel sends what the ring holds.
        let sent = unsafe {
            libc::send(
                self.socket.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            let error = std::io::Error::last_os_error();
            if !matches!(
                error.raw_os_error(),
                Some(libc::EINTR | libc::ENOBUFS | libc::EAGAIN | libc::EBUSY)
            ) {
                bail!("send on the sender's AF_PACKET ring: {error}");
            }
        }
        Ok(marked)
    }

    /// The status word of ring slot `slot`, which the kernel and this sender hand over.
    fn status(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: inside the mapped ring, 4-byte aligned (slots are 256 bytes apart); the
        // kernel writes it concurrently, hence atomic.
        unsafe { &*self.ring.add(slot * SLOT).cast::<AtomicU32>() }
    }
}

impl Drop for PacketSender {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, not used after this.
        unsafe { libc::munmap(self.ring.cast(), BLOCKS * BLOCK) };
    }
}

fn set_option<T>(fd: i32, name: libc::c_int, value: &T, what: &str) -> anyhow::Result<()> {
    set_option_at(fd, libc::SOL_PACKET, name, value, what)
}

fn set_option_at<T>(
    fd: i32,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
    what: &str,
) -> anyhow::Result<()> {
    // SAFETY: `value` is a T of the size given, as the option expects.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot set {what}"));
    }
    Ok(())
}
