//! The words the kernel and the core both operate on: every `BPF_F_MMAPABLE` array of the
//! XDP program (the clock table's `msb_seen` and `msb_restores`, the fallback table's
//! sets, and any table later made the same way), mapped here a second time so a test can see
//! what one packet changed in them, and put them back as they were (included by path,
//! `#[path]`).
//!
//! The maps are found by their shape, not their names, so a table that moves into the
//! kernel is covered without changing the test.

use std::os::fd::AsFd;

use libbpf_rs::libbpf_sys::BPF_F_MMAPABLE;
use libbpf_rs::{MapCore, MapType};

use cheetah_daemon::dataplane::map_memory::MapMemory;
use cheetah_daemon::dataplane::xdp::SteeringProgram;

/// The load view's rows (bpf/lib/load_view.h), not words the core shares.
const LOAD_VIEW_MAPS: [&str; 2] = ["active_rows", "published_loads"];

struct Mapping {
    name: String,
    at: *mut u8,
    len: usize,
    // Unmapped when the mapping drops.
    _memory: MapMemory,
}

/// The shared words as they were at the last [`SharedWords::settle`], and the live mappings.
pub struct SharedWords {
    maps: Vec<Mapping>,
    settled: Vec<Vec<u8>>,
}

/// A copy of every shared map's words.
pub type Words = Vec<Vec<u8>>;

impl SharedWords {
    pub fn of(program: &SteeringProgram) -> Self {
        let maps: Vec<Mapping> = program
            .object()
            .maps()
            .filter(|map| {
                // lb_config is mmapable for its publish word and clock base, which only
                // userspace writes (the harness sets the clock per packet): not a table.
                // Nor are the load view's rows (mmapable for the fold's writes): the
                // kernel's own view, which the core keeps in its loads instead, as
                // server_traffic is (held to the core by xdp_policy_parity's picks and
                // own counts).
                !LOAD_VIEW_MAPS.contains(&map.name().to_str().unwrap_or(""))
                    && map.name() != "lb_config"
                    && map.map_type() == MapType::Array
                    && map
                        .info()
                        .is_ok_and(|i| i.info.map_flags & BPF_F_MMAPABLE != 0)
            })
            .map(|map| {
                // An array's values are 8-byte aligned and contiguous (the fallback
                // table's sets; the other tables are one value).
                let len =
                    map.value_size().next_multiple_of(8) as usize * map.max_entries() as usize;
                let memory = MapMemory::of(map.as_fd(), len)
                    .unwrap_or_else(|e| panic!("mmap {}: {e}", map.name().to_string_lossy()));
                Mapping {
                    name: map.name().to_string_lossy().into_owned(),
                    at: memory.as_ptr(),
                    len,
                    _memory: memory,
                }
            })
            .collect();
        assert!(
            maps.iter().any(|m| m.name == "msb_restores"),
            "the clock table's words are not a one-entry mmapable map any more"
        );
        let mut words = SharedWords {
            maps,
            settled: Vec::new(),
        };
        words.settle();
        words
    }

    // The differential runner prints them; the parity test does not.
    #[allow(dead_code)]
    pub fn names(&self) -> Vec<&str> {
        self.maps.iter().map(|m| m.name.as_str()).collect()
    }

    fn live(&self, map: &Mapping) -> &[u8] {
        // SAFETY: `len` bytes of a live mapping; only this thread's syscalls and the core
        // (also this thread) write them, never while this slice is read.
        unsafe { std::slice::from_raw_parts(map.at, map.len) }
    }

    /// Takes the words as they are now as the reference of [`changed`](Self::changed).
    pub fn settle(&mut self) {
        // Into the buffers already there, and only where something moved: megabytes of
        // fresh copies per input would cost the runner most of its time in page faults.
        if self.settled.len() != self.maps.len() {
            self.settled = self.copy();
            return;
        }
        for (map, settled) in self.maps.iter().zip(&mut self.settled) {
            // SAFETY: as `live`.
            let live = unsafe { std::slice::from_raw_parts(map.at, map.len) };
            if live != &settled[..] {
                settled.copy_from_slice(live);
            }
        }
    }

    pub fn copy(&self) -> Words {
        self.maps.iter().map(|m| self.live(m).to_vec()).collect()
    }

    /// The maps whose words differ from the settled ones (name and first differing word).
    pub fn changed(&self) -> Vec<String> {
        self.differences(&self.settled)
    }

    /// The maps whose words differ from `words` (name and first differing word).
    pub fn differences(&self, words: &Words) -> Vec<String> {
        self.differences_but(words, |_, _, _| false)
    }

    /// What the core left (the words now) differs in from what the kernel left (`kernel`),
    /// but for the one difference the kernel's design allows: its fallback path refreshes
    /// a flow's time from the coarse clock (fallback.h), up to a tick behind the core's
    /// `now`, so right after a time unit begins the core may write the new unit where the
    /// kernel keeps (or writes) the one before.
    pub fn core_differences(&self, kernel: &Words) -> Vec<String> {
        self.differences_but(kernel, |map, core, kernel| {
            map == FALLBACK_MAP && only_the_coarse_clock_lags(core, kernel)
        })
    }

    /// [`core_differences`](Self::core_differences) from the settled words (the kernel
    /// wrote none).
    // The differential runner asks; the parity test compares after every kernel run.
    #[allow(dead_code)]
    pub fn core_changed(&self) -> Vec<String> {
        self.core_differences(&self.settled)
    }

    fn differences_but(
        &self,
        words: &Words,
        allowed: impl Fn(&str, &[u8], &[u8]) -> bool,
    ) -> Vec<String> {
        self.maps
            .iter()
            .zip(words)
            .filter_map(|(map, old)| {
                let live = self.live(map);
                (live != &old[..] && !allowed(&map.name, live, old)).then(|| {
                    let at = first_difference(live, old) / 4;
                    let word = |bytes: &[u8]| {
                        u32::from_ne_bytes(bytes[at * 4..at * 4 + 4].try_into().unwrap())
                    };
                    format!(
                        "{} word {at}: {:#010x} instead of {:#010x}",
                        map.name,
                        word(live),
                        word(old)
                    )
                })
            })
            .collect()
    }

    /// Puts the settled words back.
    pub fn restore_settled(&self) {
        for (map, words) in self.maps.iter().zip(&self.settled) {
            // SAFETY: as `live`, writing: no reader holds a slice of it now.
            unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), map.at, map.len) };
        }
    }
}

/// The fallback table's map, its words' time field and its unit (core lb/fallback.rs).
const FALLBACK_MAP: &str = "fallback";
const FALLBACK_TIME_SHIFT: u32 = 32;
const FALLBACK_TIME_MASK: u64 = 0xffff << FALLBACK_TIME_SHIFT;

/// Whether every word of the fallback sets `core` and `kernel` differ in differs only in
/// its time, the core's one unit after the kernel's.
fn only_the_coarse_clock_lags(core: &[u8], kernel: &[u8]) -> bool {
    let word = |bytes: &[u8]| u64::from_ne_bytes(bytes.try_into().unwrap());
    core.chunks(8).zip(kernel.chunks(8)).all(|(c, k)| {
        let (c, k) = (word(c), word(k));
        let unit = |w: u64| (w & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT;
        c == k || ((c ^ k) & !FALLBACK_TIME_MASK == 0 && unit(c) == (unit(k) + 1) & 0xffff)
    })
}

/// The first byte at which `a` and `b` differ (they do): page by page with `memcmp`, then
/// within the page, since a byte-wise search through megabytes costs a debug build
/// milliseconds per input.
fn first_difference(a: &[u8], b: &[u8]) -> usize {
    const PAGE: usize = 4096;
    let page = a
        .chunks(PAGE)
        .zip(b.chunks(PAGE))
        .position(|(x, y)| x != y)
        .expect("the words differ");
    let start = page * PAGE;
    start
        + a[start..]
            .iter()
            .zip(&b[start..])
            .position(|(x, y)| x != y)
            .expect("the page differs")
}
