// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// least_loaded.rs `LeastLoaded::pick` for a pool of at most LEAST_CACHE_POSITIONS servers,
// without scanning the pool on every SYN. The pick is the first position at or after the
// cursor, going round, whose load is the pool's least: with the positions at the least load
// as a set of bits, the first set bit from the cursor's, going round.
//
// This CPU's slot of least_loaded_cache (maps.h) keeps, for one VIP's pool:
// - min: the least load; the "at" set: the positions at it, exactly;
// - the other set: positions at min + 1; all of them when above_complete, a subset otherwise;
// and the slot of least_positions_cache beside it, each server's position in the pool.
// A set is LEAST_SET_WORDS words of 64 positions under a summary word saying which words
// hold any: adding, removing and finding the first from a position read two or three words
// whatever the pool's size, and emptying a set clears its summary.
//
// Loads move three ways, and each is caught:
// - userspace rewrites the bases or the published loads: load_generation moves, and the
//   slot is filled again by a scan (once per fold that changed something);
// - the tables are published again (another pool): the publish_seq differs, a scan;
// - this CPU's own counts move (its picks, closes, moves): load_changes logs the server,
//   and the next pick reads that server's load again and moves its bit. Only that server's
//   load changed, so the sets stay exact: a load under min makes it the only least one;
//   at min, it joins the at set; at min + 1, the other. When the at set runs empty, a
//   complete min + 1 set is the new least set; otherwise (or when more changes came than
//   the log holds) a scan fills the slot again.
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
	const struct vip_big_pool *big; // NULL: the pool is in vip_info (pool.h)
	struct least_cached *cache;
	struct least_positions *positions;
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

// 1 if `x` is not 0, without a branch.
static __always_inline __u64 nonzero(__u64 x)
{
	return (x | -x) >> 63;
}

// Pool position `position` joins set `s`: a word whose summary bit is clear is stale, so it
// is overwritten rather than added to.
static __always_inline void set_add(struct least_cached *cache, __u32 s, __u32 position)
{
	__u32 w = (position >> 6) & (LEAST_SET_WORDS - 1);
	__u64 word = 1ull << w, held = -(cache->summary[s & 1] >> w & 1);

	cache->sets[s & 1][w] = (cache->sets[s & 1][w] & held) | 1ull << (position & 63);
	cache->summary[s & 1] |= word;
}

// Pool position `position` leaves set `s`.
static __always_inline void set_remove(struct least_cached *cache, __u32 s, __u32 position)
{
	__u32 w = (position >> 6) & (LEAST_SET_WORDS - 1);
	__u64 left = cache->sets[s & 1][w] & ~(1ull << (position & 63));

	cache->sets[s & 1][w] = left;
	cache->summary[s & 1] &= ~((1ull << w) * (nonzero(left) ^ 1));
}

// The first position of the non-empty set `s` at or after `start`, going round: the first
// in start's word from start on, else in the first later word that holds any, else in the
// first word that does (start's own positions before start among them). Without a branch:
// the pick is on the SYN path, where every branch would be a path the verifier walks
// through the rest of it. Positions from the pool's length up are never in a set.
static __always_inline __u32 set_first_from(const struct least_cached *cache, __u32 s,
					    __u32 start)
{
	__u64 summary = cache->summary[s & 1], here, later, has_later;
	__u32 w, next, there, in_word;

	// The mask gives the verifier the word's bound; clang knows it a no-op (start is under
	// the pool's length) and would drop it.
	asm volatile("" : "+r"(start));
	w = (start >> 6) & (LEAST_SET_WORDS - 1);
	here = cache->sets[s & 1][w] & -(summary >> w & 1) & (~0ull << (start & 63));
	later = summary & (~1ull << w);
	has_later = -nonzero(later);
	// The word of the first position after start's word: the first later one that holds
	// any, else the first of all.
	next = (trailing_zeros(later) & has_later) | (trailing_zeros(summary) & ~has_later);
	there = next << 6 | trailing_zeros(cache->sets[s & 1][next & (LEAST_SET_WORDS - 1)]);
	in_word = w << 6 | trailing_zeros(here);
	return (in_word & -nonzero(here)) | (there & (nonzero(here) - 1));
}

// Position `position`'s load is now `load`: it joins the set that load belongs to.
static __always_inline void least_place(struct least_cached *cache, __u32 position, __u64 load)
{
	__u32 at = cache->at & 1;

	if (load < cache->min) {
		// The positions that were at min are at load + 1 exactly when min is load + 1:
		// then the old at set becomes the other one, else both start empty.
		cache->summary[at ^ 1] = 0;
		if (load + 1 != cache->min)
			cache->summary[at] = 0;
		cache->at = at ^ 1;
		cache->above_complete = 1;
		cache->min = load;
		set_add(cache, at ^ 1, position);
	} else if (load == cache->min) {
		set_add(cache, at, position);
	} else if (load == cache->min + 1) {
		set_add(cache, at ^ 1, position);
	}
}

// The fill's step: pool position `i`, read and placed (a bpf_loop callback). `metric` is a
// constant: one callback for active connections, one for the published loads.
#define LEAST_FILL_STEP(name, metric)                                                      \
	static long name(__u32 i, void *context)                                           \
	{                                                                                  \
		struct least_pick *pick = context;                                         \
		struct least_cached *cache = pick->cache;                                  \
		__u32 id = vip_pool_member(pick->vip, pick->big, i);                       \
                                                                                           \
		pick->positions->position_of[id & (SERVER_ID_SPACE - 1)] = i;              \
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
	__u32 position = pick->positions->position_of[id & (SERVER_ID_SPACE - 1)];
	__u32 at;

	if (position >= pick->pool_len || vip_pool_member(pick->vip, pick->big, position) != id)
		return 0; // not in this pool
	set_remove(cache, 0, position);
	set_remove(cache, 1, position);
	least_place(cache, position, active_view_load(pick->view.active, id));
	at = cache->at & 1;
	if (cache->summary[at])
		return 0;
	if (!cache->above_complete || !cache->summary[at ^ 1]) {
		pick->stale = 1;
		return 1;
	}
	// The min + 1 set is the new least one, and nothing is known at one more.
	cache->min += 1;
	cache->at = at ^ 1;
	cache->summary[at] = 0;
	cache->above_complete = 0;
	return 0;
}

// least_loaded.rs `LeastLoaded::pick` over `vip`'s pool (pool_len at most
// LEAST_CACHE_POSITIONS; `big`: its vip_big_pools entry, NULL if vip_info holds it) from
// this CPU's cache slot: the position in *position, the cursor after it in *next. `seq`:
// the publish_seq the pool was read under. 0 if a map has no entry.
static __always_inline int least_loaded_cached(const struct policy_state *state,
					       const struct vip_info *vip,
					       const struct vip_big_pool *big, __u32 pool_len,
					       __u32 seq, __u32 *position, __u32 *next)
{
	__u32 metric = vip->load_metric, zero = 0, slot = vip->index & (LEAST_CACHE_SLOTS - 1);
	__u32 start = state->rr_position % pool_len, logged;
	struct least_pick pick = { .vip = vip, .big = big, .pool_len = pool_len };
	const __u64 *generation = bpf_map_lookup_elem(&load_generation, &zero);
	__u64 loads;

	pick.cache = bpf_map_lookup_elem(&least_loaded_cache, &slot);
	pick.positions = bpf_map_lookup_elem(&least_positions_cache, &slot);
	pick.log = bpf_map_lookup_elem(&load_changes_cache, &zero);
	if (!pick.cache || !pick.positions || !pick.log || !generation ||
	    !load_view_open(metric, &pick.view))
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
		pick.cache->summary[0] = 0;
		pick.cache->summary[1] = 0;
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
	*position = set_first_from(pick.cache, pick.cache->at, start);
	*next = start + 1;
	return 1;
}

#endif
