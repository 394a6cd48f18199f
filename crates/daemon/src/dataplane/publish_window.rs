//! The writer's half of the publisher's latch (`bpf/lib/publish.h` is the reader's): how a
//! change of the tables reaches the XDP program's maps atomically, with no packet handed
//! up while it is written.
//!
//! The maps are written entry by entry (an array value is copied in place; a preallocated
//! hash map may reuse an element a program is still reading), and one change of the
//! tables touches several entries and maps. So every map the program reads on its straight
//! lines holds two copies of the tables (by key: `publish.h`), and the parity of
//! `publish_seq` in `lb_config` says which copy packets read. A writer opens a
//! [`PublishWindow`] (the writers' lock) and writes the copy packets are not told to read
//! ([`copy`](PublishWindow::copy)); [`flip`](PublishWindow::flip) then moves the word on by
//! one, so that packets read the copy just written, and the writer applies the same change
//! to the other copy, which packets have just left. Both copies end equal.
//!
//! Why a latch: the reader never waits and never sees half a change, and a packet that
//! arrives while a publication is written (many map writes, Maglev tables, next-hop
//! refreshes: milliseconds) reads the other, whole copy and is forwarded in the kernel;
//! only one whose reads straddle the flip (tens of nanoseconds) goes up
//! (`STAT_UP_PUBLISHING`), where a seqlock handed up every packet inside the whole window.
//! The writer pays for it with two writes of every changed entry and twice the maps'
//! memory. Linux's `raw_write_seqcount_latch` flips before each of its two writes; this
//! one writes the idle copy first and flips once between the two, which is the same
//! protocol (a copy is written only while the word's parity names the other) with one
//! move of the word per publication, and a writer that fails halfway leaves packets on a
//! whole copy: its publisher forgets what it wrote, so the next publication rewrites both.
//!
//! Why not a map-in-map swap: one swap per map would still let a packet read a new `vips`
//! entry with an old `servers` array (two swaps are not one), a swap of all maps at once
//! would need every map behind one outer map (an extra lookup per map per packet) and a
//! full copy per change; the latch costs a load of the word, an add per lookup and a
//! second `lb_config` entry, all in cache lines the program reads anyway. Writers (the
//! tables' publisher, the next-hop mirror) are serialised by a mutex, so one writer at a
//! time owns the idle copy.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The program's `lb_config.publish_seq`, mapped into this process, and the writers' lock.
pub struct PublishSeq {
    word: &'static AtomicU32,
    writers: Mutex<()>,
}

impl PublishSeq {
    pub fn new(word: &'static AtomicU32) -> Self {
        PublishSeq {
            word,
            writers: Mutex::new(()),
        }
    }

    /// Opens a window: the writers' lock, held until it is dropped. Moves nothing: packets
    /// go on reading their copy until [`PublishWindow::flip`].
    pub fn open(&self) -> PublishWindow<'_> {
        // A writer that panicked left the copies unequal at worst, with packets on a whole
        // one; its publisher forgot what it wrote. The lock's poison says nothing more.
        let writer = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        PublishWindow {
            word: self.word,
            wrote: false,
            flipped: false,
            _writer: writer,
        }
    }

    /// The word now.
    pub fn current(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }
}

/// An open window: the writers' lock, and whether this writer wrote and flipped.
pub struct PublishWindow<'a> {
    word: &'static AtomicU32,
    wrote: bool,
    flipped: bool,
    _writer: MutexGuard<'a, ()>,
}

impl PublishWindow<'_> {
    /// The copy of the tables to write now: the one packets are not told to read. Only
    /// this window's [`flip`](Self::flip) moves it while the window is open.
    pub fn copy(&self) -> u32 {
        (self.word.load(Ordering::SeqCst) & 1) ^ 1
    }

    /// The word's value now: what a write of a whole `lb_config` value must carry in its
    /// `publish_seq` field.
    pub fn seq(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }

    /// Call before every write: the copy to write into ([`copy`](Self::copy)).
    pub fn before_write(&mut self) -> u32 {
        self.wrote = true;
        self.copy()
    }

    /// Ends the first of the two writes: if anything was written (a refresh that changes
    /// nothing moves nothing, so it hands no packet up), packets move to the copy just
    /// written, and the answer is true: apply the same change again, to
    /// [`copy`](Self::copy), which is now the other one. False after the second write.
    pub fn flip(&mut self) -> bool {
        if !self.wrote || self.flipped {
            return false;
        }
        // A locked add is a full barrier: every map write above (each a system call that
        // returned) is visible before packets are told to read its copy.
        self.word.fetch_add(1, Ordering::SeqCst);
        self.flipped = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word() -> &'static AtomicU32 {
        Box::leak(Box::new(AtomicU32::new(0)))
    }

    #[test]
    fn the_writer_writes_the_idle_copy_then_flips_once_and_writes_the_other() {
        let seq = PublishSeq::new(word());
        assert_eq!(seq.current(), 0, "packets read copy 0");
        {
            let mut window = seq.open();
            assert_eq!(window.before_write(), 1, "the copy packets do not read");
            assert_eq!(seq.current(), 0, "writing the idle copy moves nothing");
            assert!(window.flip());
            assert_eq!(seq.current(), 1, "packets now read the copy just written");
            assert_eq!(window.before_write(), 0, "then the copy packets just left");
            assert!(!window.flip(), "two writes, one flip");
        }
        assert_eq!(seq.current(), 1);
        let mut window = seq.open();
        assert_eq!(window.before_write(), 0);
        assert!(window.flip());
        assert_eq!(window.seq(), 2);
    }

    #[test]
    fn a_window_that_writes_nothing_moves_nothing() {
        let seq = PublishSeq::new(word());
        let mut window = seq.open();
        assert!(!window.flip());
        drop(window);
        assert_eq!(seq.current(), 0);
    }

    #[test]
    fn writers_take_turns() {
        let seq = std::sync::Arc::new(PublishSeq::new(word()));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let seq = std::sync::Arc::clone(&seq);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let mut window = seq.open();
                        let before = seq.current();
                        let copy = window.before_write();
                        assert_eq!(copy, (before & 1) ^ 1, "wrote the copy packets read");
                        assert!(window.flip());
                        assert_eq!(seq.current(), before + 1, "another writer moved it");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(seq.current(), 4000);
    }
}
