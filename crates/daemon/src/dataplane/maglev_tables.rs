//! The VIPs' Maglev tables in the XDP program's `maglev_tables` (`bpf/lib/maps.h`), an
//! array of maps by VIP index, so that maglev mode and cheetah's connections without
//! timestamps are placed in the kernel as the core places them (`bpf/lib/maglev.h`).
//!
//! Each table is its own inner array, made at the config's size (`maglev_table_size`
//! slots, [`MAGLEV_CHUNK_SLOTS`] to an entry), filled while no packet can see it, then
//! swapped into its VIP's slot by one update, inside the publisher's window like every
//! other published write. Memory follows the VIPs with a table, not `MAX_VIPS` times the
//! largest size; a table whose slots did not change is left as it is (the publisher keeps
//! what it wrote), so a publication that leaves the pools alone writes none of them.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use anyhow::Context;
use cheetah_core::policy::maglev::MaglevTable;
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::publish_window::LazyWindow;
use super::xdp::SteeringProgram;
use super::xdp_layout::{MaglevChunk, MAGLEV_CHUNK_SLOTS, MAGLEV_NO_SERVER, MAX_VIPS};

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

/// A new inner array holding `table`, not yet in any slot of `maglev_tables`.
fn inner_map(table: &MaglevTable) -> anyhow::Result<MapHandle> {
    let chunks = chunks(table);
    let count = u32::try_from(chunks.len()).context("maglev_table_size: too big for a BPF map")?;
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        // As the template's (maps.h): an inner array of any size fits the outer map.
        map_flags: libbpf_sys::BPF_F_INNER_MAP,
        ..Default::default()
    };
    let map = MapHandle::create(
        MapType::Array,
        Some("maglev_table"),
        4,
        std::mem::size_of::<MaglevChunk>() as u32,
        count,
        &opts,
    )
    .context("cannot create a Maglev table's map")?;
    let keys: Vec<u8> = (0..count).flat_map(u32::to_ne_bytes).collect();
    let values: Vec<u8> = chunks
        .iter()
        .flat_map(|chunk| chunk.server.iter().flat_map(|id| id.to_ne_bytes()))
        .collect();
    map.update_batch(&keys, &values, count, MapFlags::ANY, MapFlags::ANY)
        .context("cannot fill a Maglev table's map")?;
    Ok(map)
}

/// Makes `maglev_tables` hold exactly `tables`: a VIP whose table differs from `last`'s
/// gets a new inner array, one no longer wanted loses its slot. `last` is what this
/// publisher wrote before (`None`: unknown, so every table is written and every other
/// slot emptied).
pub fn sync(
    program: &SteeringProgram,
    window: &mut LazyWindow,
    tables: &MaglevTables,
    last: Option<&MaglevTables>,
) -> anyhow::Result<()> {
    let outer = program.try_map(MAP)?;
    for (index, table) in tables {
        if last.and_then(|l| l.get(index)) == Some(table) {
            continue;
        }
        let inner = inner_map(table)?;
        window.before_write()?;
        // The outer map holds the inner one from here on; this process's fd may go.
        outer
            .update(
                &index.to_ne_bytes(),
                &(inner.as_fd().as_raw_fd() as u32).to_ne_bytes(),
                MapFlags::ANY,
            )
            .with_context(|| format!("cannot put VIP {index}'s Maglev table in place"))?;
    }
    let stale: Vec<u32> = match last {
        Some(last) => last
            .keys()
            .filter(|index| !tables.contains_key(index))
            .copied()
            .collect(),
        None => (0..MAX_VIPS as u32)
            .filter(|index| !tables.contains_key(index))
            .filter(|index| {
                matches!(
                    outer.lookup(&index.to_ne_bytes(), MapFlags::ANY),
                    Ok(Some(_))
                )
            })
            .collect(),
    };
    for index in stale {
        window.before_write()?;
        outer
            .delete(&index.to_ne_bytes())
            .with_context(|| format!("cannot take VIP {index}'s Maglev table away"))?;
    }
    Ok(())
}

/// The id of the inner array in VIP `index`'s slot (`None`: no table): a table written
/// again is a new map with a new id.
pub fn table_id(program: &SteeringProgram, index: u32) -> anyhow::Result<Option<u32>> {
    let outer = program.try_map(MAP)?;
    Ok(outer
        .lookup(&index.to_ne_bytes(), MapFlags::ANY)?
        .map(|id| u32::from_ne_bytes(id[..4].try_into().unwrap_or_default())))
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
