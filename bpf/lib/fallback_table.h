// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The shared fallback table's operations (crates/core/src/lb/fallback.rs) over the
// `fallback` map's sets (maps.h), one for one the core's: lookup, its refresh of a flow's
// time, insert and remove. The paths that use them: fallback.h (client segments without
// timestamps, their SYNs) and fast_path.h (a server's SYN-ACK without timestamps).

#ifndef CHEETAH_LIB_FALLBACK_TABLE_H
#define CHEETAH_LIB_FALLBACK_TABLE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"

// A word: valid:1 | reserved:1 | server:14 | time:16 | tag:32 (fallback.rs `pack`).
#define FALLBACK_VALID (1ULL << 63)
#define FALLBACK_SERVER_SHIFT 48
#define FALLBACK_SERVER_MASK 0x3fffULL
#define FALLBACK_TIME_SHIFT 32
#define FALLBACK_TIME_MASK (0xffffULL << FALLBACK_TIME_SHIFT)
#define FALLBACK_TAG_MASK 0xffffffffULL
// The time field counts units of 2^30 ns (1.07 s).
#define FALLBACK_TIME_UNIT_SHIFT 30

// A flow the table knows: the way it is in and the word read from it.
struct fallback_hit {
	__u64 *way;
	__u64 word;
};

// fallback.rs `lookup` without its write: the first valid word of the flow's set (its
// hash's low bits) holding the flow's tag (its hash's high half). The set is one entry of
// the map, so the 8 ways are one lookup and one cache line.
static __always_inline int fallback_find(const struct lb_config *config, __u64 hash,
					 struct fallback_hit *hit)
{
	__u32 set = (__u32)hash & config->fallback_mask;
	__u64 tag = hash >> 32;
	struct fallback_set *ways = bpf_map_lookup_elem(&fallback, &set);

	if (!ways)
		return 0;
#pragma unroll
	for (int i = 0; i < FALLBACK_WAYS; i++) {
		__u64 word = *(volatile __u64 *)&ways->way[i];

		if ((word & FALLBACK_VALID) && (word & FALLBACK_TAG_MASK) == tag) {
			hit->way = &ways->way[i];
			hit->word = word;
			return 1;
		}
	}
	return 0;
}

static __always_inline __u32 fallback_server(__u64 word)
{
	return (word >> FALLBACK_SERVER_SHIFT) & FALLBACK_SERVER_MASK;
}

// fallback.rs `lookup`'s write: the word's time becomes `now`'s unit only when the unit
// changed, so a busy flow writes its shared line about once a second; by a
// compare-and-swap from the word read, which loses only to another CPU's or worker's write
// (one as recent).
static __always_inline void fallback_touch(const struct fallback_hit *hit, __u64 now)
{
	__u64 unit = (now >> FALLBACK_TIME_UNIT_SHIFT) & 0xffff;
	__u64 word = hit->word;

	if (((word & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT) != unit)
		__sync_val_compare_and_swap(hit->way, word,
					    (word & ~FALLBACK_TIME_MASK) | (unit << FALLBACK_TIME_SHIFT));
}

// fallback.rs `remove`: forgets the flow, every way holding its tag (a race between two
// inserts can leave it in two), each by a compare-and-swap from the word read, so that a
// way another CPU or worker took meanwhile keeps its new flow. The set is looked up again
// rather than carried in fallback_hit: this path is rare, the LB's stack is not.
static __always_inline void fallback_remove(const struct lb_config *config, __u64 hash)
{
	__u32 set = (__u32)hash & config->fallback_mask;
	__u64 tag = hash >> 32;
	struct fallback_set *ways = bpf_map_lookup_elem(&fallback, &set);

	if (!ways)
		return;
#pragma unroll
	for (int i = 0; i < FALLBACK_WAYS; i++) {
		__u64 word = *(volatile __u64 *)&ways->way[i];

		if ((word & FALLBACK_VALID) && (word & FALLBACK_TAG_MASK) == tag)
			__sync_val_compare_and_swap(&ways->way[i], word, 0);
	}
}

// fallback.rs `INSERT_ATTEMPTS`: how many times an insert reads its set again after
// losing a compare-and-swap before it gives the entry up.
#define FALLBACK_INSERT_ATTEMPTS 4

// fallback.rs `Insert`.
enum fallback_insert {
	FALLBACK_ADDED,
	FALLBACK_UPDATED,
	FALLBACK_EVICTED,
	FALLBACK_LOST,
};

// fallback.rs `insert_word`: puts `new` (a valid word) into `set` over the word with its
// tag, else into the first empty way, else over the least recently used way (the first
// of the oldest), each by a compare-and-swap from the word read, so that the kernel and
// the workers race on a set as the workers race among themselves.
static __always_inline enum fallback_insert fallback_insert_word(struct fallback_set *set,
								 __u64 new)
{
	__u64 tag = new & FALLBACK_TAG_MASK;
	__u64 unit = (new & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT;

	for (int attempt = 0; attempt < FALLBACK_INSERT_ATTEMPTS; attempt++) {
		__u64 oldest_word = 0, oldest_age = 0, expected;
		int empty = -1, oldest = -1, lost = 0, way;
		enum fallback_insert outcome;

#pragma unroll
		for (int i = 0; i < FALLBACK_WAYS; i++) {
			__u64 word = *(volatile __u64 *)&set->way[i];
			__u64 age;

			if (!(word & FALLBACK_VALID)) {
				if (empty < 0)
					empty = i;
				continue;
			}
			if ((word & FALLBACK_TAG_MASK) == tag) {
				if (word == new ||
				    __sync_val_compare_and_swap(&set->way[i], word, new) == word)
					return FALLBACK_UPDATED;
				lost = 1;
				break;
			}
			age = (unit - ((word & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT)) & 0xffff;
			if (oldest < 0 || age > oldest_age) {
				oldest = i;
				oldest_word = word;
				oldest_age = age;
			}
		}
		if (lost)
			continue;
		if (empty >= 0) {
			way = empty;
			expected = 0;
			outcome = FALLBACK_ADDED;
		} else {
			way = oldest;
			expected = oldest_word;
			outcome = FALLBACK_EVICTED;
		}
		if (__sync_val_compare_and_swap(&set->way[way & (FALLBACK_WAYS - 1)], expected,
						new) == expected)
			return outcome;
	}
	return FALLBACK_LOST;
}

// The insert as a global function, so that the verifier checks it once, on its own: its
// 4 attempts over 8 ways reach each way with a different (empty, oldest) pair, and inlined
// they were walked again for every state a caller reached them in (45% of the
// instructions the verifier processed for the whole program). A call costs a few ns, on
// the two paths that insert (a client SYN without timestamps, a SYN-ACK without them).
__noinline int fallback_insert(struct fallback_set *set, __u64 new)
{
	if (!set)
		return FALLBACK_LOST;
	return fallback_insert_word(set, new);
}

// fallback.rs `pack`: the word remembering server `id` for the flow `hash`, used at `now`.
static __always_inline __u64 fallback_word(__u64 hash, __u32 id, __u64 now)
{
	return FALLBACK_VALID | (((__u64)id & FALLBACK_SERVER_MASK) << FALLBACK_SERVER_SHIFT) |
	       (((now >> FALLBACK_TIME_UNIT_SHIFT) & 0xffff) << FALLBACK_TIME_SHIFT) |
	       (hash >> 32);
}

#endif
