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

// The entry `cursor` stands for in a cycle of `len` (> 0) entries: the cursor modulo the
// length (a cursor carried over from a longer cycle, or a CPU's starting offset).
static __always_inline __u32 cycle_entry(__u32 cursor, __u32 len, __u32 *next)
{
	__u32 at = cursor < len ? cursor : cursor % len;

	*next = at + 1 == len ? 0 : at + 1;
	return at;
}

// The pool position of this CPU's next pick from `schedule`; NULL (no cycle published)
// is the balanced cycle, every position once in order. The cycle's length and positions
// are bounded here, so that a cycle of another pool (an awrr cycle between a publication
// and the fold that replaces it) still picks a member of this one.
static __always_inline __u32 schedule_decide(const struct policy_state *state,
					     const struct vip_schedule *schedule,
					     __u32 pool_len, __u32 *next)
{
	__u32 len, at, position;

	if (!schedule)
		return cycle_entry(state->schedule_cursor, pool_len, next);
	len = schedule->len;
	if (len == 0 || len > SCHEDULE_CAP)
		len = SCHEDULE_CAP;
	at = cycle_entry(state->schedule_cursor, len, next);
	position = schedule->position[at & (SCHEDULE_CAP - 1)];
	return position < pool_len ? position : position % pool_len;
}

#endif
