//! The writer's half of the publisher's seqlock (`bpf/lib/publish.h` is the reader's): how
//! a change of the tables reaches the XDP program's maps atomically.
//!
//! The maps are written entry by entry (an array value is copied in place; a preallocated
//! hash map may reuse an element a program is still reading), and one change of the
//! tables touches several entries and maps. So every writer of a map the program reads on
//! its straight lines opens a [`PublishWindow`] before its first write: `publish_seq` in
//! `lb_config` turns odd, and even again when the window closes. The program reads the
//! word before it reads any table and again before it writes anything; if the word was
//! odd or moved, it hands the packet up unchanged (`STAT_UP_PUBLISHING`) and the AF_XDP
//! workers decide it on one whole snapshot of the core's tables. So no packet acts on half
//! a change, and a packet that races one costs a trip to userspace, not a wrong verdict.
//!
//! Why a sequence word and not a map-in-map swap: one swap per map would still let a
//! packet read a new `vips` entry with an old `servers` array (two swaps are not one), a
//! swap of all maps at once would need every map behind one outer map (an extra lookup per
//! map per packet) and a full copy per change; the word costs two loads of a cache line
//! the program reads anyway. Writers (the tables' publisher, the next-hop mirror) are
//! serialised by a mutex, so the word is odd exactly while one of them writes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::xdp::SteeringProgram;

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

    /// Opens a window: until it is dropped, the program hands up every packet whose
    /// decision reads a published map.
    pub fn open(&self) -> PublishWindow<'_> {
        // A writer that panicked mid-window left the word odd; its window's drop ran
        // during the unwind and made it even again, so the lock's poison says nothing.
        let writer = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        // A locked add is a full barrier: the odd word is visible before any map write.
        let before = self.word.fetch_add(1, Ordering::SeqCst);
        debug_assert!(
            before.is_multiple_of(2),
            "publish_seq was odd outside a window"
        );
        PublishWindow {
            word: self.word,
            seq: before.wrapping_add(1),
            _writer: writer,
        }
    }

    /// The word now (even outside a window).
    pub fn current(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }
}

/// An open window: the sequence word is odd until this is dropped.
pub struct PublishWindow<'a> {
    word: &'static AtomicU32,
    seq: u32,
    _writer: MutexGuard<'a, ()>,
}

impl PublishWindow<'_> {
    /// The word's (odd) value while this window is open: what a write of the whole
    /// `lb_config` value must carry in its `publish_seq` field.
    pub fn seq(&self) -> u32 {
        self.seq
    }
}

impl Drop for PublishWindow<'_> {
    fn drop(&mut self) {
        // After every map write of the window (each a system call that returned).
        self.word.fetch_add(1, Ordering::SeqCst);
    }
}

/// A window opened at a writer's first write (a refresh that changes nothing opens none,
/// so it hands no packet up) and closed when this is dropped.
pub struct LazyWindow<'p> {
    program: &'p SteeringProgram,
    open: Option<PublishWindow<'p>>,
}

impl<'p> LazyWindow<'p> {
    pub fn new(program: &'p SteeringProgram) -> Self {
        LazyWindow {
            program,
            open: None,
        }
    }

    /// Call before every write: opens the window if it is not open yet, and returns the
    /// (odd) sequence word a whole `lb_config` value must carry.
    pub fn before_write(&mut self) -> anyhow::Result<u32> {
        if self.open.is_none() {
            self.open = Some(self.program.publish_window()?);
        }
        Ok(self.open.as_ref().map_or(0, PublishWindow::seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word() -> &'static AtomicU32 {
        Box::leak(Box::new(AtomicU32::new(0)))
    }

    #[test]
    fn the_word_is_odd_exactly_while_a_window_is_open() {
        let seq = PublishSeq::new(word());
        assert_eq!(seq.current(), 0);
        {
            let window = seq.open();
            assert_eq!(window.seq(), 1);
            assert_eq!(seq.current(), 1);
        }
        assert_eq!(seq.current(), 2);
        let window = seq.open();
        assert_eq!(window.seq(), 3);
        drop(window);
        assert_eq!(seq.current(), 4);
    }

    #[test]
    fn writers_take_turns() {
        let seq = std::sync::Arc::new(PublishSeq::new(word()));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let seq = std::sync::Arc::clone(&seq);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let window = seq.open();
                        assert_eq!(seq.current(), window.seq(), "another writer moved it");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(seq.current(), 8000);
    }
}
