// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// A client's established segment's VIP by its (address, port) from the vip_slots array: a
// multiplicative hash of the two to a slot, one read, one compare of the slot's tag. NULL
// when the slot holds another VIP or none (a VIP whose slot another took, or no VIP at
// all): then the vips hash map answers, as for every other segment. The publisher places
// the VIPs (dataplane/vip_slots.rs) by the same hash.

#ifndef CHEETAH_LIB_VIP_SLOTS_H
#define CHEETAH_LIB_VIP_SLOTS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"
#include "publish.h"

// The slot of (addr, port) as the packet carries them (network byte order, read as
// numbers on this host, as the publisher reads them).
static __always_inline __u32 vip_slot_of(__u32 addr, __u16 port)
{
	return ((addr ^ ((__u32)port << 16)) * VIP_SLOT_MULTIPLIER) >> (32 - VIP_SLOT_BITS);
}

static __always_inline const struct vip_slot *vip_slot_at(__u32 copy, __u32 addr, __u16 port)
{
	__u64 tag = VIP_SLOT_USED | (__u64)port << 32 | addr;
	__u32 slot = latched_index(copy, vip_slot_of(addr, port), VIP_SLOTS);
	const struct vip_slot *at = bpf_map_lookup_elem(&vip_slots, &slot);

	if (at && at->tag == tag)
		return at;
	return NULL;
}

#endif
