// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// wrr and awrr from a published cycle (struct vip_schedule): schedule.rs `Schedule::pick`,
// one read per SYN instead of a scan of the pool. Decide, then commit, as policy.h's
// steps: schedule_decide only reads and returns the pool position and, in `next`, what
// the cursor becomes.

#ifndef CHEETAH_LIB_SCHEDULE_H
#define CHEETAH_LIB_SCHEDULE_H

#include <linux/bpf.h>
#include <linux/types.h>

#include "cheetah_shared.h"
#include "maps.h"

// The entry `cursor` stands for in a cycle of `len` (> 0) entries: the cursor modulo the
// length (a cursor carried over from a longer cycle, or a CPU's starting offset).
static __always_inline __u32 cycle_entry(__u32 cursor, __u32 len, __u32 *next)
{
	__u32 at = cursor < len ? cursor : cursor % len;

	*next = at + 1 == len ? 0 : at + 1;
	return at;
}

// The pool position of this CPU's next pick from `schedule`; NULL (no cycle published)
// is the balanced cycle, every position once in order. A cycle goes on beyond its first
// SCHEDULE_CAP entries only given `chunk_key` (wrr's, naming the VIP and the copy), in
// wrr_schedule_chunks; -1 if the chunk is missing. The cycle's length and positions are
// bounded here, so that a cycle of another pool (an awrr cycle between a publication and
// the fold that replaces it) still picks a member of this one.
static __always_inline int schedule_decide(const struct policy_state *state,
					   const struct vip_schedule *schedule,
					   struct schedule_chunk_key *chunk_key, __u32 pool_len,
					   __u32 *next)
{
	const struct schedule_chunk *chunk;
	const __u16 *entries;
	__u32 len, max_len, at, position;

	if (!schedule)
		return cycle_entry(state->schedule_cursor, pool_len, next);
	max_len = chunk_key ? SCHEDULE_MAX_LEN : SCHEDULE_CAP;
	len = schedule->len;
	if (len == 0 || len > max_len)
		len = max_len;
	at = cycle_entry(state->schedule_cursor, len, next);
	entries = schedule->position;
	if (at >= SCHEDULE_CAP) {
		// (Never without chunk_key, as len is then at most SCHEDULE_CAP; the verifier
		// cannot tell.)
		if (!chunk_key)
			return -1;
		chunk_key->chunk = at / SCHEDULE_CAP;
		chunk = bpf_map_lookup_elem(&wrr_schedule_chunks, chunk_key);
		if (!chunk)
			return -1;
		entries = chunk->position;
	}
	// The entry within its chunk. The mask is the bound the verifier checks; clang would
	// drop it where it knows `at` is below SCHEDULE_CAP.
	asm volatile("" : "+r"(at));
	position = entries[at & (SCHEDULE_CAP - 1)];
	return position < pool_len ? position : position % pool_len;
}

#endif
