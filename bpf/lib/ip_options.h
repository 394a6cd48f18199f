// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// A TCP segment or ICMP error whose IPv4 header carries options takes the same in-kernel
// path as one without: the options are lifted off before the LB decides and put back
// after, so every rule below (parse.h onward) reads a 20-byte IP header at fixed offsets,
// as vlan.h does for tags. The core's straight line skips the options (fast_path.rs
// `ipv4_off_the_line`) and keeps them, so verdict, bytes and counters stay the core's.
//
// While lifted, the header says IHL 5 and a total length shorter by the options; its
// checksum is left as it came. The LB only ever updates that checksum for what it changes
// (csum.h), so once the options, IHL and total length are back it is what the core's
// incremental updates make of the original. What the LB needs of the true length (bytes
// counted for a server, the MTU a next hop is checked against) it gets from the lifted
// length it is handed (parse.h `plain_ip_len`).
//
// Only a TCP segment or an ICMP message whose IPv4 header the core accepts is lifted
// (version 4, total length within the frame and covering the header): a garbled header
// stays as it came, to be dropped as the core drops it (fast_path.h
// `drop_bad_ipv4_header`). An ICMP error's own header is lifted, not its quote's (whose
// options still send it up: icmp_path.h); the ICMP checksum covers neither.

#ifndef CHEETAH_LIB_IP_OPTIONS_H
#define CHEETAH_LIB_IP_OPTIONS_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "stats.h"

// The Ethernet header and the IPv4 header's fixed 20 bytes: what moves over the options.
#define IP_OPTIONS_HEAD_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr))
#define IP_OPTIONS_MAX_LEN 40

_Static_assert(sizeof(((struct lift_scratch *)0)->head) == IP_OPTIONS_HEAD_LEN &&
		       sizeof(((struct lift_scratch *)0)->options) == IP_OPTIONS_MAX_LEN,
	       "lift_scratch (maps.h) holds the headers and the most options there are");

// How many bytes of options the IPv4 header of an untagged TCP or ICMP frame carries (4
// to 40), or 0 when there are none to lift (no options, another protocol, or a header the
// core refuses).
static __always_inline __u32 ip_options_len(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	__u32 version_ihl, header_len, total_len;

	if ((void *)(ip + 1) > data_end)
		return 0;
	version_ihl = *(__u8 *)ip;
	// The commonest frame leaves here: 0x45 is no options.
	if (version_ihl <= 0x45 || version_ihl > 0x4f || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_ICMP))
		return 0;
	header_len = (version_ihl & 0x0f) * 4;
	total_len = bpf_ntohs(ip->tot_len);
	if (total_len < header_len || data + sizeof(struct ethhdr) + total_len > data_end)
		return 0;
	return header_len - sizeof(struct iphdr);
}

// This CPU's lift_scratch slot, if `len` (masked: the verifier then sees the compare's
// bounds) is a size the helpers may copy into it: ip_options_len returns 4..40.
static __always_inline struct lift_scratch *options_slot(__u32 len)
{
	return len >= 4 && len <= IP_OPTIONS_MAX_LEN ? lift_slot() : NULL;
}

// The slot's IPv4 header, behind its Ethernet header.
static __always_inline struct iphdr *slot_ip(struct lift_scratch *slot)
{
	return (void *)(slot->head + sizeof(struct ethhdr));
}

// Takes the `len` bytes of options (ip_options_len) off the frame into lift_scratch:
// the Ethernet and fixed IPv4 headers move up over them, IHL and total length say so, and
// the frame starts `len` bytes later. 1 if so; 0 if the frame was left as it was; -1 if
// the headers moved but the frame's start could not (the frame holds `len` bytes past
// its headers, so this never happens): the frame is then neither. Not inlined, as
// ip_options_put_back: their locals never share the frame the LB's call sits on.
static __noinline int ip_options_lift(struct xdp_md *ctx, __u32 len)
{
	struct lift_scratch *slot;
	struct iphdr *ip;

	len &= 0x3f;
	slot = options_slot(len);
	if (!slot)
		return 0;
	ip = slot_ip(slot);
	if (bpf_xdp_load_bytes(ctx, 0, slot->head, IP_OPTIONS_HEAD_LEN) ||
	    bpf_xdp_load_bytes(ctx, IP_OPTIONS_HEAD_LEN, slot->options, len))
		return 0;
	ip->ihl = 5;
	ip->tot_len = bpf_htons(bpf_ntohs(ip->tot_len) - len);
	if (bpf_xdp_store_bytes(ctx, len, slot->head, IP_OPTIONS_HEAD_LEN))
		return 0;
	return bpf_xdp_adjust_head(ctx, (int)len) == 0 ? 1 : -1;
}

// Puts back the `len` bytes of options ip_options_lift took, behind the headers as they
// are now (the LB may have rewritten MACs, addresses and checksum), with IHL and total
// length as they came. 0 if there was no room in front of the frame.
static __noinline int ip_options_put_back(struct xdp_md *ctx, __u32 len)
{
	struct lift_scratch *slot;
	struct iphdr *ip;

	len &= 0x3f;
	slot = options_slot(len);
	if (!slot)
		return 0;
	ip = slot_ip(slot);
	if (bpf_xdp_adjust_head(ctx, -(int)len))
		return 0;
	if (bpf_xdp_load_bytes(ctx, len, slot->head, IP_OPTIONS_HEAD_LEN))
		return 0;
	ip->ihl = 5 + len / 4;
	ip->tot_len = bpf_htons(bpf_ntohs(ip->tot_len) + len);
	return !bpf_xdp_store_bytes(ctx, 0, slot->head, IP_OPTIONS_HEAD_LEN) &&
	       !bpf_xdp_store_bytes(ctx, IP_OPTIONS_HEAD_LEN, slot->options, len);
}

// Runs `decide` (the LB: an XDP verdict, told how many bytes of options were lifted) on
// the frame, its IP options lifted while it runs if it has any. The frame gets its options
// back whatever the verdict, as with_tags_lifted gives tags back; the slot still holds
// them then (the LB never touches lift_scratch).
static __always_inline int with_ip_options_lifted(struct xdp_md *ctx,
						  int (*decide)(struct xdp_md *, __u32))
{
	__u32 len = ip_options_len(ctx);
	int action, lifted = 0;

	// One call of `decide` whatever the frame: each inlined copy would take stack.
	if (len)
		lifted = ip_options_lift(ctx, len);
	if (lifted < 0) {
		count(STAT_NO_METADATA_ROOM);
		return XDP_DROP;
	}
	action = decide(ctx, lifted ? len : 0);
	if (!lifted || action == XDP_ABORTED)
		return action;
	if (!ip_options_put_back(ctx, len)) {
		count(STAT_NO_METADATA_ROOM);
		return XDP_DROP;
	}
	return action;
}

#endif
