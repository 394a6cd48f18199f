//! One worker's AF_XDP sockets: one per interface, all on the worker's queue, all sharing
//! one UMEM. Sharing the UMEM is what lets a frame received on the client-facing interface
//! leave through the server-facing one without a copy: the worker moves its address from
//! one socket's RX ring to the other's TX ring.

use std::num::NonZeroU32;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use anyhow::Context;
use cheetah_core::types::Mac;
use xdpilone::xdp::XdpDesc;
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig};

use super::meta::META_LEN;

/// An interface the LB serves, as the data path knows it.
#[derive(Clone, Debug)]
pub struct Interface {
    pub name: String,
    pub ifindex: u32,
    pub mac: Mac,
    /// Position in the config's list; the XDP program's socket map is keyed by it.
    pub slot: u32,
    pub queues: u32,
}

pub const FRAME_SIZE: u32 = 2048;
const RING_SIZE: u32 = 2048;
/// Frames the kernel sends per `sendto` in copy mode.
const KERNEL_TX_BATCH: u32 = 32;

pub struct Port {
    pub slot: u32,
    pub ifindex: u32,
    pub mac: Mac,
    device: DeviceQueue,
    rx: RingRx,
    tx: RingTx,
}

impl Port {
    pub fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}

/// In copy mode every frame sent becomes an skb charged to the socket's send buffer until
/// the peer has taken it; the default (about 200 KiB) stalls transmission under bursts and
/// the TX ring overflows. Room for a full ring of full-size frames avoids that.
fn raise_send_buffer(fd: RawFd) {
    let bytes: libc::c_int = (RING_SIZE * 4096) as libc::c_int;
    // SAFETY: setsockopt on an open socket with a correctly sized int option. FORCE needs
    // CAP_NET_ADMIN, which the data path has; without it the default stays, as before.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Anonymous memory for the UMEM, unmapped when dropped.
struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(len: usize) -> anyhow::Result<Self> {
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("cannot map UMEM memory");
        }
        Ok(Area {
            ptr: NonNull::new(ptr.cast()).unwrap(),
            len,
        })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; the UMEM using it was dropped first.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Field order is drop order: sockets, then the UMEM registration, then its memory.
pub struct WorkerPorts {
    pub ports: Vec<Port>,
    _umem: Umem,
    area: Area,
    free: Vec<u64>,
    frames: u32,
}

// SAFETY: the rings and the UMEM are used by the one worker thread that owns this value;
// it is only moved to that thread once, after setup.
unsafe impl Send for WorkerPorts {}

impl WorkerPorts {
    /// Opens a socket on `queue` of every interface that has that queue.
    pub fn open(interfaces: &[Interface], queue: u32, frames: u32) -> anyhow::Result<Self> {
        let area = Area::new(frames as usize * FRAME_SIZE as usize)?;
        let config = UmemConfig {
            fill_size: RING_SIZE,
            complete_size: RING_SIZE,
            frame_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
        };
        let slice = NonNull::slice_from_raw_parts(area.ptr, area.len);
        // SAFETY: `area` is page-aligned, lives as long as the UMEM (field order), and is
        // only accessed through frames the kernel has handed back.
        let umem = unsafe { Umem::new(config, slice) }
            .map_err(|e| anyhow::anyhow!("cannot register UMEM: {e:?} (needs root and AF_XDP)"))?;
        let socket_config = SocketConfig {
            rx_size: NonZeroU32::new(RING_SIZE),
            tx_size: NonZeroU32::new(RING_SIZE),
            bind_flags: SocketConfig::XDP_BIND_NEED_WAKEUP,
        };
        let mut ports = Vec::new();
        for iface in interfaces.iter().filter(|i| queue < i.queues) {
            let mut info = IfInfo::invalid();
            info.from_ifindex(iface.ifindex)
                .map_err(|e| anyhow::anyhow!("interface {}: cannot query ({e:?})", iface.name))?;
            info.set_queue(queue);
            let errno = |what: &'static str| {
                let name = iface.name.clone();
                move |e: xdpilone::Errno| {
                    anyhow::anyhow!("interface {name} queue {queue}: {what} failed: {e:?}")
                }
            };
            let socket = if ports.is_empty() {
                Socket::with_shared(&info, &umem).map_err(errno("AF_XDP socket"))?
            } else {
                Socket::new(&info).map_err(errno("AF_XDP socket"))?
            };
            let device = umem
                .fq_cq(&socket)
                .map_err(errno("fill/completion rings"))?;
            // Sockets sharing the UMEM inherit its owner's flags; the kernel refuses them
            // with their own.
            let config = if ports.is_empty() {
                socket_config.clone()
            } else {
                SocketConfig {
                    bind_flags: 0,
                    ..socket_config.clone()
                }
            };
            let user = umem.rx_tx(&socket, &config).map_err(errno("rx/tx rings"))?;
            umem.bind(&user).map_err(errno("bind"))?;
            let rx = user.map_rx().map_err(errno("rx ring mmap"))?;
            raise_send_buffer(rx.as_raw_fd());
            let tx = user.map_tx().map_err(errno("tx ring mmap"))?;
            ports.push(Port {
                slot: iface.slot,
                ifindex: iface.ifindex,
                mac: iface.mac,
                device,
                rx,
                tx,
            });
        }
        let free = (0..frames as u64).map(|i| i * FRAME_SIZE as u64).collect();
        let mut this = WorkerPorts {
            ports,
            _umem: umem,
            area,
            free,
            frames,
        };
        for port in 0..this.ports.len() {
            this.refill(port);
        }
        Ok(this)
    }

    pub fn frames(&self) -> u32 {
        self.frames
    }

    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// The bytes of a frame: `addr` is a descriptor address (frame start plus headroom).
    ///
    /// # Safety
    /// The caller owns the frame (received and not yet handed back to the kernel) and
    /// holds no other reference into it.
    pub unsafe fn bytes<'frame>(&self, addr: u64, len: u32) -> &'frame mut [u8] {
        debug_assert!(addr as usize + len as usize <= self.area.len);
        std::slice::from_raw_parts_mut(self.area.ptr.as_ptr().add(addr as usize), len as usize)
    }

    /// The metadata the XDP program put in front of the packet at `addr` (`receive` moved
    /// the descriptor past it), if the frame holds that much in front.
    pub fn meta(&self, addr: u64) -> Option<&[u8; META_LEN]> {
        let frame_start = addr - addr % FRAME_SIZE as u64;
        if addr - frame_start < META_LEN as u64 {
            return None;
        }
        // SAFETY: inside the frame this worker owns; read only.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                self.area.ptr.as_ptr().add(addr as usize - META_LEN),
                META_LEN,
            )
        };
        bytes.try_into().ok()
    }

    /// Takes received descriptors from `port` into `out` (up to its free capacity), each
    /// moved past the metadata the XDP program writes as the frame's first `META_LEN`
    /// bytes (bpf/lib/steer.h `write_meta`), so that it names the packet alone and `meta`
    /// finds the metadata in front of it.
    pub fn receive(&mut self, port: usize, out: &mut Vec<XdpDesc>) -> usize {
        let room = (out.capacity() - out.len()) as u32;
        if room == 0 {
            return 0;
        }
        let mut rx = self.ports[port].rx.receive(room);
        let before = out.len();
        while let Some(desc) = rx.read() {
            out.push(past_meta(desc));
        }
        rx.release();
        out.len() - before
    }

    /// Queues frames for transmission on `port`; frames that do not fit are freed and
    /// their number returned.
    pub fn transmit(&mut self, port: usize, descs: &[XdpDesc]) -> usize {
        if descs.is_empty() {
            return 0;
        }
        // xdpilone reserves against a cached view of the kernel's consumer and refreshes it
        // only when that view shows no room at all, so one call may take fewer slots than
        // are free; ask again until everything is queued or the ring is really full.
        let mut sent = 0;
        while sent < descs.len() {
            let mut tx = self.ports[port].tx.transmit((descs.len() - sent) as u32);
            let queued = tx.insert(descs[sent..].iter().copied()) as usize;
            tx.commit();
            if queued == 0 {
                break;
            }
            sent += queued;
        }
        for desc in &descs[sent..] {
            self.release(desc.addr);
        }
        descs.len() - sent
    }

    /// Kicks the kernel to send what is queued on `port`. In copy mode (veth, generic XDP)
    /// the kernel sends only inside the syscall, at most 32 frames per call
    /// (`TX_BATCH_SIZE`), so one kick per loop let the TX ring fill under bursts and drop
    /// frames; kick until the ring is drained, with a bound in case the device pushes back.
    pub fn flush(&mut self, port: usize) {
        let tx = &self.ports[port].tx;
        let mut kicks = tx.pending() / KERNEL_TX_BATCH + 2;
        while tx.pending() > 0 && tx.needs_wakeup() && kicks > 0 {
            tx.wake();
            kicks -= 1;
        }
    }

    pub fn tx_pending(&self) -> bool {
        self.ports.iter().any(|p| p.tx.pending() > 0)
    }

    /// Returns transmitted frames to the free list.
    pub fn reap_completions(&mut self, port: usize) -> usize {
        let device = &mut self.ports[port].device;
        let mut done = device.complete(RING_SIZE);
        let mut n = 0;
        while let Some(addr) = done.read() {
            self.free.push(addr - addr % FRAME_SIZE as u64);
            n += 1;
        }
        done.release();
        n
    }

    /// Gives free frames to `port`'s fill ring, keeping a share for the other ports and for
    /// copies; returns whether the kernel asked to be woken to receive.
    pub fn refill(&mut self, port: usize) -> bool {
        let share = (self.frames as usize / (self.ports.len() + 1)).min(RING_SIZE as usize);
        let device = &mut self.ports[port].device;
        let queued = device.pending() as usize;
        let mut want = share.saturating_sub(queued).min(self.free.len());
        // As in `transmit`: a reservation may see fewer free slots than there are.
        while want > 0 {
            let mut fill = device.fill(want as u32);
            let mut given = 0;
            while given < fill.capacity() as usize {
                let Some(&addr) = self.free.last() else { break };
                if !fill.insert_once(addr) {
                    break;
                }
                self.free.pop();
                given += 1;
            }
            fill.commit();
            if given == 0 {
                break;
            }
            want -= given;
        }
        device.needs_wakeup()
    }

    pub fn wake_rx(&mut self, port: usize) {
        self.ports[port].device.wake();
    }

    /// A free frame for a copy of a packet (ICMP errors copied to every server).
    pub fn allocate(&mut self) -> Option<u64> {
        self.free.pop()
    }

    pub fn release(&mut self, addr: u64) {
        self.free.push(addr - addr % FRAME_SIZE as u64);
    }

    /// Headroom left in front of copies, so they look like received frames.
    pub const COPY_HEADROOM: u64 = 256;
}

/// A received descriptor moved past the metadata in front of its packet. The program
/// writes the metadata on every frame it steers (it drops a frame it cannot write it on),
/// so a shorter frame is cut to nothing, which the core drops as truncated.
fn past_meta(desc: XdpDesc) -> XdpDesc {
    let skip = desc.len.min(META_LEN as u32);
    XdpDesc {
        addr: desc.addr + u64::from(skip),
        len: desc.len - skip,
        options: desc.options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_frame_is_read_from_past_its_metadata() {
        let desc = past_meta(XdpDesc {
            addr: 4096 + 256,
            len: 60 + META_LEN as u32,
            options: 0,
        });
        assert_eq!((desc.addr, desc.len), (4096 + 256 + META_LEN as u64, 60));
        let short = past_meta(XdpDesc {
            addr: 256,
            len: 3,
            options: 0,
        });
        assert_eq!((short.addr, short.len), (259, 0));
    }
}
