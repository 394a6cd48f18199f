//! The memory of a `BPF_F_MMAPABLE` array, mapped shared into this process: the words the
//! XDP program reads and writes, read and written here through atomics.
//!
//! One mapping type for two lifetimes. Most mappings back tables that live in the
//! `LbShared` every thread holds until the process exits (the clock words, the close
//! filter, the fallback table, the publish word): no point is safe to unmap them, so they
//! are [kept for the process](MapMemory::keep_for_process), once each. The others (the
//! load rows, a Maglev table being written) are unmapped when their owner drops.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// A shared mapping of the first bytes of an mmapable array; unmapped on drop.
pub struct MapMemory {
    at: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory, valid until drop; whoever reads or writes through it does
// so through atomics (or, for a table being written, while the program reads the other
// copy), and nothing in it is tied to a thread.
unsafe impl Send for MapMemory {}
// SAFETY: as above.
unsafe impl Sync for MapMemory {}

impl MapMemory {
    /// Maps the first `bytes` bytes (rounded up to whole pages) of the array behind `map`.
    /// The kernel refuses a map that is not a `BPF_F_MMAPABLE` array that long.
    pub fn of(map: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = bytes.max(1).div_ceil(page) * page;
        // SAFETY: a new shared mapping of a map's fd at offset 0, nothing else touched.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = NonNull::new(at.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(MapMemory { at, len })
    }

    /// Where the mapping starts (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.at.as_ptr()
    }

    /// Keeps the mapping for the rest of the process and returns where it starts: for
    /// the words of tables that live until exit (see the module doc). A mapping also keeps
    /// its map alive once the program object is gone.
    pub fn keep_for_process(self) -> *mut u8 {
        let at = self.as_ptr();
        std::mem::forget(self);
        at
    }
}

impl Drop for MapMemory {
    fn drop(&mut self) {
        // SAFETY: a mapping this value made and alone owns; what borrows from it borrows
        // from its owner, which is dropping.
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
    }
}
