// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// A VIP's pool by position, as the policies and the baselines' `pool[h % n]` read it: in
// vip_info itself up to MAX_HASH_POOL servers, in the VIP's vip_big_pools entry beyond
// (cheetah_shared.h). The publisher writes a big pool's entry in the
// same copy as its vip_info (publish.h), so the two agree for a reader of that copy.

#ifndef CHEETAH_LIB_POOL_H
#define CHEETAH_LIB_POOL_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"
#include "publish.h"

// Where `vip`'s pool of vip->pool_len servers lies: 1 with *big NULL (in vip_info), or
// with *big its vip_big_pools entry; 0 if the kernel holds no pool for it (an empty or
// unpublished one, or an entry missing).
static __always_inline int vip_pool_open(__u32 copy, const struct vip_info *vip,
					 const struct vip_big_pool **big)
{
	__u32 pool_len = vip->pool_len, index;

	*big = NULL;
	if (pool_len == 0 || pool_len > MAX_BIG_POOL)
		return 0;
	if (pool_len <= MAX_HASH_POOL)
		return 1;
	index = latched_index(copy, vip->index, MAX_VIPS);
	*big = bpf_map_lookup_elem(&vip_big_pools, &index);
	return *big != NULL;
}

// The server at pool position `position` (< vip->pool_len) of a pool vip_pool_open
// found. The masks give the verifier each array's bound (a position is often a
// remainder, which it cannot bound); the empty asm keeps clang from dropping a mask it
// knows is a no-op.
static __always_inline __u32 vip_pool_member(const struct vip_info *vip,
					     const struct vip_big_pool *big, __u32 position)
{
	asm volatile("" : "+r"(position));
	if (big)
		return big->id[position & (MAX_BIG_POOL - 1)];
	return vip->pool[position & (MAX_HASH_POOL - 1)];
}

#endif
