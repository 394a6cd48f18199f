// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Tagged frames (a trunk port: one 802.1Q tag, or 802.1ad then 802.1Q) take the same
// in-kernel path as untagged ones: their tags are lifted off before the LB decides and put
// back after, so every rule below (parse.h onward) reads an untagged frame at fixed
// offsets. The core's straight line reads past the same tags (fast_path.rs
// `plain_ipv4_tcp`) and keeps them, so verdict, bytes and counters stay the core's.
//
// Only a tagged IPv4 frame is lifted: anything else behind tags (IPv6, ARP, a third tag)
// is the host's, as the core and steering say, and stays as it came.

#ifndef CHEETAH_LIB_VLAN_H
#define CHEETAH_LIB_VLAN_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "steer.h"

// The MAC addresses in front of the tags.
#define VLAN_MACS_LEN 12
#define VLAN_TAG_LEN 4

// How many bytes of tags a tagged IPv4 frame carries in front of its EtherType (4 or 8),
// or 0 for any other frame (untagged included).
static __always_inline __u32 vlan_tags_len(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct vlan_tag *tag = (void *)(eth + 1);

	if ((void *)(tag + 2) > data_end || !vlan_tag_type(eth->h_proto))
		return 0;
	if (tag[0].proto == bpf_htons(ETH_P_IP))
		return VLAN_TAG_LEN;
	if (vlan_tag_type(tag[0].proto) && tag[1].proto == bpf_htons(ETH_P_IP))
		return 2 * VLAN_TAG_LEN;
	return 0;
}

// The MACs as three words, moved in registers rather than through the stack: the program's
// frame adds to the LB's (lb.h).
struct vlan_macs {
	__u32 words[3];
};

static __always_inline void vlan_macs_read(struct vlan_macs *macs, const void *at)
{
	macs->words[0] = *(const __u32 *)at;
	macs->words[1] = *(const __u32 *)(at + 4);
	macs->words[2] = *(const __u32 *)(at + 8);
}

static __always_inline void vlan_macs_write(void *at, const struct vlan_macs *macs)
{
	*(__u32 *)at = macs->words[0];
	*(__u32 *)(at + 4) = macs->words[1];
	*(__u32 *)(at + 8) = macs->words[2];
}

// Takes `len` bytes of tags (vlan_tags_len) off the frame into lift_scratch: the MACs
// move up over them and the frame starts `len` bytes later. 1 if so; 0 if the frame was
// left as it was; -1 if the MACs moved but the frame's start could not (vlan_tags_len left
// room for it, so this never happens): the frame is then neither tagged nor untagged.
// Not inlined, as vlan_put_back: its locals then never share the frame the LB's call
// sits on.
static __noinline int vlan_lift(struct xdp_md *ctx, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct lift_scratch *slot = lift_slot();
	struct vlan_macs macs;

	if (!slot || data + VLAN_MACS_LEN + 2 * VLAN_TAG_LEN > data_end)
		return 0;
	vlan_macs_read(&macs, data);
	slot->tags[0] = *(__u32 *)(data + VLAN_MACS_LEN);
	slot->tags[1] = *(__u32 *)(data + VLAN_MACS_LEN + VLAN_TAG_LEN);
	vlan_macs_write(data + (len == 2 * VLAN_TAG_LEN ? 2 * VLAN_TAG_LEN : VLAN_TAG_LEN), &macs);
	return bpf_xdp_adjust_head(ctx, (int)len) == 0 ? 1 : -1;
}

// Puts back the `len` bytes of tags vlan_lift took, behind the frame's MACs as they are
// now (the LB may have rewritten them). 0 if there was no room in front of the frame.
static __noinline int vlan_put_back(struct xdp_md *ctx, __u32 len)
{
	struct lift_scratch *slot = lift_slot();
	void *data, *data_end;
	struct vlan_macs macs;

	if (!slot || bpf_xdp_adjust_head(ctx, -(int)len))
		return 0;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + VLAN_MACS_LEN + 2 * VLAN_TAG_LEN > data_end)
		return 0;
	vlan_macs_read(&macs, data + (len == 2 * VLAN_TAG_LEN ? 2 * VLAN_TAG_LEN : VLAN_TAG_LEN));
	vlan_macs_write(data, &macs);
	*(__u32 *)(data + VLAN_MACS_LEN) = slot->tags[0];
	if (len == 2 * VLAN_TAG_LEN)
		*(__u32 *)(data + VLAN_MACS_LEN + VLAN_TAG_LEN) = slot->tags[1];
	return 1;
}

// Runs `decide` (the LB: an XDP verdict) on the frame, tags lifted while it runs if it
// has any. The frame gets its tags back whatever the verdict: one sent on (TX, REDIRECT,
// PASS) needs them, and a dropped one then leaves as it came, as the core leaves it.
// The slot's tags outlive `decide`: the LB never touches lift_scratch's tags, and a
// program runs to its end on one CPU.
static __always_inline int with_tags_lifted(struct xdp_md *ctx, int (*decide)(struct xdp_md *))
{
	__u32 len = vlan_tags_len(ctx);
	int action, lifted = 0;

	// One call of `decide` whatever the frame: each inlined copy would take stack.
	if (len)
		lifted = vlan_lift(ctx, len);
	if (lifted < 0) {
		count(STAT_NO_METADATA_ROOM);
		return XDP_DROP;
	}
	action = decide(ctx);
	if (!lifted || action == XDP_ABORTED)
		return action;
	if (!vlan_put_back(ctx, len)) {
		count(STAT_NO_METADATA_ROOM);
		return XDP_DROP;
	}
	return action;
}

#endif
