// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// least_loaded.rs `LeastLoaded::pick` for a pool of at most MAX_HASH_POOL servers, without
// scanning the pool on every SYN. The pick is the first position at or after the cursor,
// going round, whose load is the pool's least: with the positions at the least load as
// the bits of a word, that is the lowest set bit of the word rotated by the cursor.
//
// This CPU's slot of least_loaded_cache (maps.h) keeps, for one VIP's pool:
// - min: the least load; at_min: the positions at it, exactly;
// - above_min: positions at min + 1; all of them when above_complete, a subset otherwise.
//
// Loads move three ways, and each is caught:
// - userspace rewrites the bases or the published loads: load_generation moves, and the
//   slot is filled again by a scan (once per fold that changed something);
// - the tables are published again (another pool): the publish_seq differs, a scan;
// - this CPU's own counts move (its picks, closes, moves): load_changes logs the server,
//   and the next pick reads that server's load again and moves its bit. Only that server's
//   load changed, so the sets stay exact: a load under min makes it the only least one;
//   at min, it joins at_min; at min + 1, above_min. When at_min runs empty, a complete
//   above_min is the new least set; otherwise (or when more changes came than the log
//   holds) a scan fills the slot again.
// The pick is so the core's for the same loads, whatever the slot's history: the parity
// tests hold it to the core's scan.
//
// A scan costs what the old per-SYN scan did (about 2.5 ns a position); it runs about once
// every n to 2n picks of a balanced pool and after every change of the published loads.

#ifndef CHEETAH_LIB_LEAST_LOADED_H
#define CHEETAH_LIB_LEAST_LOADED_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "load_view.h"
#include "maps.h"
#include "pool.h"

// What the fill's and the catch-up's steps share (bpf_loop callbacks: kept on the
// caller's stack).
struct least_pick {
	const struct vip_info *vip;
	struct least_cached *cache;
	const struct load_changes *log;
	struct load_view view;
	__u32 pool_len;
	__u32 stale; // the catch-up found the least load unknown: fill the slot again
};

// Trailing zeros of `x` (64 for 0), without a branch: every branch here would be a path
// the verifier walks through the rest of the SYN path.
static __always_inline __u32 trailing_zeros(__u64 x)
{
	__u64 v = (x & -x) - 1;

	v = v - ((v >> 1) & 0x5555555555555555ull);
	v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
	v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
	return (v * 0x0101010101010101ull) >> 56;
}

// Position `position`'s load is now `load`: its bit goes to the set that load belongs to.
static __always_inline void least_place(struct least_cached *cache, __u32 position, __u64 load)
{
	__u64 bit = 1ull << (position & (MAX_HASH_POOL - 1));

	if (load < cache->min) {
		// The positions that were at min are at load + 1 exactly when min is load + 1.
		cache->above_min = load + 1 == cache->min ? cache->at_min : 0;
		cache->above_complete = 1;
		cache->at_min = bit;
		cache->min = load;
	} else if (load == cache->min) {
		cache->at_min |= bit;
	} else if (load == cache->min + 1) {
		cache->above_min |= bit;
	}
}

// The fill's step: pool position `i`, read and placed (a bpf_loop callback). `metric` is a
// constant: one callback for active connections, one for the published loads.
#define LEAST_FILL_STEP(name, metric)                                                      \
	static long name(__u32 i, void *context)                                           \
	{                                                                                  \
		struct least_pick *pick = context;                                         \
		struct least_cached *cache = pick->cache;                                  \
		__u32 id = vip_pool_member(pick->vip, NULL, i);                            \
                                                                                           \
		cache->position_of[id & (SERVER_ID_SPACE - 1)] = i;                        \
		least_place(cache, i, view_load(&pick->view, metric, id));                 \
		return 0;                                                                  \
	}

LEAST_FILL_STEP(least_fill_active, LOAD_METRIC_ACTIVE)
LEAST_FILL_STEP(least_fill_published, LOAD_METRIC_PACKETS)

// The catch-up's step: the `k`-th change not yet seen, of server `id` (a bpf_loop
// callback, active connections only: no own count moves a published load). 1 stops.
static long least_catch_up(__u32 k, void *context)
{
	struct least_pick *pick = context;
	struct least_cached *cache = pick->cache;
	__u32 id = pick->log->id[(cache->changes_seen + k) & (LOAD_CHANGES - 1)];
	__u32 position = cache->position_of[id & (SERVER_ID_SPACE - 1)];
	__u64 bit;

	if (position >= pick->pool_len || vip_pool_member(pick->vip, NULL, position) != id)
		return 0; // not in this pool
	bit = 1ull << (position & (MAX_HASH_POOL - 1));
	cache->at_min &= ~bit;
	cache->above_min &= ~bit;
	least_place(cache, position, active_view_load(pick->view.active, id));
	if (cache->at_min)
		return 0;
	if (!cache->above_complete || !cache->above_min) {
		pick->stale = 1;
		return 1;
	}
	cache->min += 1;
	cache->at_min = cache->above_min;
	cache->above_min = 0;
	cache->above_complete = 0;
	return 0;
}

// least_loaded.rs `LeastLoaded::pick` over `vip`'s pool in vip_info (pool_len at most
// MAX_HASH_POOL) from this CPU's cache slot: the position in *position, the cursor after
// it in *next. `seq`: the publish_seq the pool was read under. 0 if a map has no entry.
static __always_inline int least_loaded_cached(const struct policy_state *state,
					       const struct vip_info *vip, __u32 pool_len,
					       __u32 seq, __u32 *position, __u32 *next)
{
	__u32 metric = vip->load_metric, zero = 0, slot = vip->index & (LEAST_CACHE_SLOTS - 1);
	__u32 start = state->rr_position % pool_len, logged;
	struct least_pick pick = { .vip = vip, .pool_len = pool_len };
	const __u64 *generation = bpf_map_lookup_elem(&load_generation, &zero);
	__u64 at_min, rotated, loads;

	pick.cache = bpf_map_lookup_elem(&least_loaded_cache, &slot);
	pick.log = bpf_map_lookup_elem(&load_changes_cache, &zero);
	if (!pick.cache || !pick.log || !generation || !load_view_open(metric, &pick.view))
		return 0;
	// Read before any load: a change userspace makes after it shows at the next pick.
	loads = *generation;
	logged = pick.log->seq;
	if (pick.cache->vip == vip->index + 1 && pick.cache->seq == seq &&
	    pick.cache->generation == loads && logged - pick.cache->changes_seen <= LOAD_CHANGES) {
		if (metric == LOAD_METRIC_ACTIVE && logged != pick.cache->changes_seen)
			bpf_loop(logged - pick.cache->changes_seen, least_catch_up, &pick, 0);
	} else {
		pick.stale = 1;
	}
	if (pick.stale) {
		pick.cache->min = ~0ull;
		pick.cache->at_min = 0;
		pick.cache->above_min = 0;
		if (metric == LOAD_METRIC_ACTIVE)
			bpf_loop(pool_len, least_fill_active, &pick, 0);
		else
			bpf_loop(pool_len, least_fill_published, &pick, 0);
		pick.cache->above_complete = 1;
		pick.cache->vip = vip->index + 1;
		pick.cache->seq = seq;
		pick.cache->generation = loads;
	}
	pick.cache->changes_seen = logged;
	// The first position at or after `start` at the least load, going round: positions
	// from pool_len up are never set, so rotating the 64 bits goes round the pool.
	at_min = pick.cache->at_min;
	rotated = at_min >> start | at_min << ((64 - start) & 63);
	*position = (start + trailing_zeros(rotated)) & (MAX_HASH_POOL - 1);
	*next = start + 1;
	return 1;
}

#endif
