//! Storage for a table's words: owned (on the heap), or someone else's that live as long
//! as the process (a memory-mapped BPF array), so that the core's tables and the XDP
//! program can work on the very same words.

use std::ptr::NonNull;

/// A table's words: owned, or borrowed for `'static`. One pointer either way, read like a
/// `Box<[T]>`.
pub struct Words<T: 'static> {
    words: NonNull<[T]>,
    owned: bool,
}

// SAFETY: the words are atomics (or sets of them), which any thread may share; an owned
// array is freed only by the one `Words` that owns it.
unsafe impl<T: Sync> Send for Words<T> {}
unsafe impl<T: Sync> Sync for Words<T> {}

impl<T> Words<T> {
    /// Words this value owns and frees.
    pub fn owned(words: Box<[T]>) -> Self {
        Words {
            words: NonNull::from(Box::leak(words)),
            owned: true,
        }
    }

    /// Words that outlive every table: a static array, or a mapping the process never
    /// unmaps.
    pub fn borrowed(words: &'static [T]) -> Self {
        Words {
            words: NonNull::from(words),
            owned: false,
        }
    }
}

impl<T> std::ops::Deref for Words<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `words` is live: owned and freed only in `drop`, or `'static`.
        unsafe { self.words.as_ref() }
    }
}

impl<T> Drop for Words<T> {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: made by `Box::leak` in `owned`, and dropped only here, once.
            drop(unsafe { Box::from_raw(self.words.as_ptr()) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[test]
    fn owned_and_borrowed_words_read_alike() {
        let owned = Words::owned((0..4).map(AtomicU64::new).collect());
        assert_eq!(owned[3].load(Relaxed), 3);
        let leaked: &'static [AtomicU64] = Box::leak((0..4).map(AtomicU64::new).collect());
        let borrowed = Words::borrowed(leaked);
        borrowed[1].store(9, Relaxed);
        drop(borrowed);
        assert_eq!(
            leaked[1].load(Relaxed),
            9,
            "a borrowed array outlives its Words"
        );
    }
}
