//! The VIPs' Maglev tables in the XDP program's `maglev_tables` (`bpf/lib/maps.h`), an
//! array of maps by VIP index, so that maglev mode and cheetah's connections without
//! timestamps are placed in the kernel as the core places them (`bpf/lib/maglev.h`).
//!
//! Each table is its own inner array, made at the config's size (`maglev_table_size`
//! slots, [`MAGLEV_CHUNK_SLOTS`] to an entry) the first time its VIP has one, and put in
//! the VIP's slot. Memory follows the VIPs with a table, not `MAX_VIPS` times the largest
//! size. A table whose slots changed is then rewritten in place, copied through a mapping
//! of its (mmapable) array inside the publisher's window, like every other published
//! array: a packet that reads it meanwhile sees the window and goes up. Not a fresh inner array swapped in per
//! change: every update of an array of maps waits for an RCU grace period
//! (`maybe_wait_bpf_programs`), milliseconds during which the window would stay open and
//! every packet go up. A table whose slots did not change is left as it is (the publisher
//! keeps what it wrote), so a publication that leaves the pools alone writes none of them.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use anyhow::Context;
use cheetah_core::policy::maglev::MaglevTable;
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::map_memory::MapMemory;
use super::publish_window::PublishWindow;
use super::xdp::SteeringProgram;
use super::xdp_layout::{
    MaglevChunk, MAGLEV_CHUNK_SLOTS, MAGLEV_NO_SERVER, MAX_VIPS, PUBLISH_COPIES,
};

/// VIP index -> its pool's table (a VIP with an empty pool has none).
pub type MaglevTables = BTreeMap<u32, Arc<MaglevTable>>;

const MAP: &str = "maglev_tables";

/// The chunks of `table`, its last one padded with [`MAGLEV_NO_SERVER`].
pub fn chunks(table: &MaglevTable) -> Vec<MaglevChunk> {
    table
        .slots()
        .chunks(MAGLEV_CHUNK_SLOTS)
        .map(|slots| {
            let mut chunk = MaglevChunk {
                server: [MAGLEV_NO_SERVER; MAGLEV_CHUNK_SLOTS],
            };
            chunk.server[..slots.len()].copy_from_slice(slots);
            chunk
        })
        .collect()
}

/// A new, empty inner array of `count` chunks, not yet in any slot of `maglev_tables`.
fn inner_map(count: u32) -> anyhow::Result<MapHandle> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        // As the template's (maps.h): an inner array of any size fits the outer map, and
        // the publisher writes it through a mapping.
        map_flags: libbpf_sys::BPF_F_INNER_MAP | libbpf_sys::BPF_F_MMAPABLE,
        ..Default::default()
    };
    MapHandle::create(
        MapType::Array,
        Some("maglev_table"),
        4,
        std::mem::size_of::<MaglevChunk>() as u32,
        count,
        &opts,
    )
    .context("cannot create a Maglev table's map")
}

/// A table as the bytes of its inner array: every chunk, in order (an array's 64-byte
/// values are contiguous, in a mapping as in the map).
struct Chunks {
    count: u32,
    bytes: Vec<u8>,
}

impl Chunks {
    fn of(table: &MaglevTable) -> anyhow::Result<Self> {
        let count = u32::try_from(table.len().div_ceil(MAGLEV_CHUNK_SLOTS))
            .context("maglev_table_size: too big for a BPF map")?;
        let mut bytes = Vec::with_capacity(count as usize * std::mem::size_of::<MaglevChunk>());
        for slots in table.slots().chunks(MAGLEV_CHUNK_SLOTS) {
            for slot in 0..MAGLEV_CHUNK_SLOTS {
                let id = slots.get(slot).copied().unwrap_or(MAGLEV_NO_SERVER);
                bytes.extend_from_slice(&id.to_ne_bytes());
            }
        }
        Ok(Chunks { count, bytes })
    }

    /// Copies every chunk into `inner` through a mapping of it (a memcpy: a batch update
    /// of the same took milliseconds, all of them inside the window).
    fn write(&self, inner: &MapHandle) -> anyhow::Result<()> {
        let memory = MapMemory::of(inner.as_fd(), self.bytes.len())
            .context("cannot mmap a Maglev table's map")?;
        // SAFETY: `memory` maps at least `bytes.len()` writable bytes (above); the program
        // only reads them, and only in the other copy while this one is written (publish.h).
        unsafe {
            std::ptr::copy_nonoverlapping(self.bytes.as_ptr(), memory.as_ptr(), self.bytes.len())
        };
        Ok(())
    }
}

/// The inner array in VIP `index`'s slot, if there is one.
fn inner_of(outer: &libbpf_rs::Map, index: u32) -> anyhow::Result<Option<MapHandle>> {
    let Some(id) = outer.lookup(&index.to_ne_bytes(), MapFlags::ANY)? else {
        return Ok(None);
    };
    let id = u32::from_ne_bytes(id[..4].try_into().context("a map id is 4 bytes")?);
    Ok(Some(MapHandle::from_map_id(id).with_context(|| {
        format!("cannot open VIP {index}'s Maglev table (map id {id})")
    })?))
}

/// Where a changed table goes.
enum Target {
    /// The VIP's inner array, of the right size: rewritten in place.
    InPlace(MapHandle),
    /// A new inner array, already filled, to put in the VIP's slot.
    New(MapHandle),
}

/// What makes `maglev_tables` hold a publication's tables, in each copy of the tables
/// (`publish_window.rs`), all of it worked out before the publisher's window opens
/// (`plan`), so that the window stays open for the writes alone (`apply`).
pub struct Plan {
    /// By copy; taken by `apply`.
    copies: Vec<Option<CopyPlan>>,
}

/// One copy's writes: the VIPs' slots there (`copy * MAX_VIPS + index`).
struct CopyPlan {
    writes: Vec<(u32, Chunks, Target)>,
    stale: Vec<u32>,
}

/// The slot of VIP `index`'s table in copy `copy`.
fn slot_of(copy: usize, index: u32) -> u32 {
    (copy * MAX_VIPS) as u32 + index
}

/// Works out how `maglev_tables` comes to hold exactly `tables` in each copy: a VIP whose
/// table differs from `last`'s has it written (into its inner array, or a new one of the
/// right size, filled now, while no packet can see it), one no longer wanted loses its
/// slot. `last` is what this publisher wrote before, in both copies (`None`: unknown, so
/// every table is written and every other slot emptied).
pub fn plan(
    program: &SteeringProgram,
    tables: &MaglevTables,
    last: Option<&MaglevTables>,
) -> anyhow::Result<Plan> {
    let outer = program.try_map(MAP)?;
    let mut copies = Vec::new();
    for copy in 0..PUBLISH_COPIES {
        let mut writes = Vec::new();
        for (index, table) in tables {
            if last.and_then(|l| l.get(index)) == Some(table) {
                continue;
            }
            let slot = slot_of(copy, *index);
            let chunks = Chunks::of(table)?;
            let target = match inner_of(&outer, slot)?.filter(|i| i.max_entries() == chunks.count) {
                Some(inner) => Target::InPlace(inner),
                None => {
                    let inner = inner_map(chunks.count)?;
                    chunks.write(&inner)?;
                    Target::New(inner)
                }
            };
            writes.push((slot, chunks, target));
        }
        let stale = match last {
            Some(last) => last
                .keys()
                .filter(|index| !tables.contains_key(index))
                .map(|index| slot_of(copy, *index))
                .collect(),
            None => (0..MAX_VIPS as u32)
                .filter(|index| !tables.contains_key(index))
                .map(|index| slot_of(copy, index))
                .filter(|slot| {
                    matches!(
                        outer.lookup(&slot.to_ne_bytes(), MapFlags::ANY),
                        Ok(Some(_))
                    )
                })
                .collect(),
        };
        copies.push(Some(CopyPlan { writes, stale }));
    }
    Ok(Plan { copies })
}

impl Plan {
    /// Writes what [`plan`] worked out for the copy `window` writes. New inner arrays go
    /// in by one batch update of the outer map where the kernel has it: every single
    /// update of an array of maps waits for an RCU grace period (`maybe_wait_bpf_programs`,
    /// milliseconds), a batch once at most, so a start with many VIPs keeps its window
    /// short.
    pub fn apply(
        &mut self,
        program: &SteeringProgram,
        window: &mut PublishWindow,
    ) -> anyhow::Result<()> {
        let Some(CopyPlan { writes, stale }) = self
            .copies
            .get_mut(window.copy() as usize)
            .and_then(Option::take)
        else {
            return Ok(());
        };
        let outer = program.try_map(MAP)?;
        let (mut keys, mut fds, mut new) = (Vec::new(), Vec::new(), Vec::new());
        for (slot, chunks, target) in writes {
            match target {
                Target::InPlace(inner) => {
                    window.before_write();
                    chunks.write(&inner)?;
                }
                Target::New(inner) => {
                    keys.extend_from_slice(&slot.to_ne_bytes());
                    fds.extend_from_slice(&(inner.as_fd().as_raw_fd() as u32).to_ne_bytes());
                    // Kept open until the outer map holds it.
                    new.push(inner);
                }
            }
        }
        if !new.is_empty() {
            window.before_write();
            let batch =
                outer.update_batch(&keys, &fds, new.len() as u32, MapFlags::ANY, MapFlags::ANY);
            if batch.is_err() {
                // A kernel without batch updates of arrays of maps: one by one.
                for (key, fd) in keys.chunks(4).zip(fds.chunks(4)) {
                    outer
                        .update(key, fd, MapFlags::ANY)
                        .context("cannot put a new Maglev table in place")?;
                }
            }
        }
        for slot in stale {
            window.before_write();
            outer
                .delete(&slot.to_ne_bytes())
                .with_context(|| format!("cannot take the Maglev table in slot {slot} away"))?;
        }
        Ok(())
    }
}

/// The inner array in VIP `index`'s slot of copy `copy` (`None`: no table), opened by its
/// id: for tests and diagnostics.
pub fn table_map(
    program: &SteeringProgram,
    copy: usize,
    index: u32,
) -> anyhow::Result<Option<MapHandle>> {
    inner_of(&program.try_map(MAP)?, slot_of(copy, index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cheetah_core::types::ServerId;

    #[test]
    fn chunks_hold_the_slots_in_order_and_pad_the_last_with_no_server() {
        let table = MaglevTable::build(&[ServerId(1), ServerId(2), ServerId(7)], 65_537);
        let chunks = chunks(&table);
        assert_eq!(chunks.len(), 65_537usize.div_ceil(MAGLEV_CHUNK_SLOTS));
        let flat: Vec<u16> = chunks.iter().flat_map(|c| c.server).collect();
        assert_eq!(&flat[..65_537], table.slots());
        assert!(flat[65_537..].iter().all(|&id| id == MAGLEV_NO_SERVER));
    }
}
