// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The program's counters: one per-CPU slot per enum xdp_stat, summed by userspace.

#ifndef CHEETAH_LIB_STATS_H
#define CHEETAH_LIB_STATS_H

#include "maps.h"

static __always_inline void count(__u32 stat)
{
	__u64 *value = bpf_map_lookup_elem(&stats, &stat);

	if (value)
		*value += 1;
}

#endif
