// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The core's `MaglevTable::lookup` (crates/core/src/policy/maglev.rs) over the tables the
// publisher puts in maglev_tables (maps.h): slot `flow hash % maglev_size` of the VIP's
// table. Maglev mode places every client segment by it; cheetah mode places by it the
// connections without timestamps the fallback table does not know (fallback.h).

#ifndef CHEETAH_LIB_MAGLEV_H
#define CHEETAH_LIB_MAGLEV_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"
#include "publish.h"

// The server owning `hash` in the Maglev table of VIP `vip_index`, into `id`: 0 when the
// VIP has no published table (not published yet), which the caller hands up. An empty
// pool has none either, but callers drop its packets first (KERNEL_POLICY_EMPTY). Reads
// published maps only: call before the publish check.
static __always_inline int maglev_lookup(const struct lb_config *config, __u32 vip_index,
					 __u64 hash, __u32 *id)
{
	__u32 size = config->maglev_size, chunk_index;
	__u32 latched = latched_index(config->copy, vip_index, MAX_VIPS);
	struct maglev_chunk *chunk;
	void *table;
	__u64 slot;

	if (size == 0)
		return 0;
	table = bpf_map_lookup_elem(&maglev_tables, &latched);
	if (!table)
		return 0;
	slot = hash % size;
	chunk_index = slot / MAGLEV_CHUNK_SLOTS;
	chunk = bpf_map_lookup_elem(table, &chunk_index);
	if (!chunk)
		return 0;
	*id = chunk->server[slot & (MAGLEV_CHUNK_SLOTS - 1)];
	return *id != MAGLEV_NO_SERVER;
}

#endif
