// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Traffic to a VIP address that no VIP takes, dropped in the kernel under the core's
// reason (worker.rs `classify_rest`): UDP (`unsupported_udp`), an IP protocol other than
// TCP, UDP and ICMP (`unsupported_protocol`), and a TCP segment to a port no VIP is on
// (`vip_port_unknown`), and a TCP segment whose header the core's parse refuses
// (`truncated_tcp`, `bad_tcp_data_offset`, whatever its port). A flood of it (a port scan
// of a VIP, UDP at a VIP address, garbled segments) then costs the kernel a few lookups a
// packet, not a trip to a userspace worker each.

#ifndef CHEETAH_LIB_NOT_A_VIP_H
#define CHEETAH_LIB_NOT_A_VIP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "fast_path.h"
#include "parse.h"
#include "publish.h"
#include "stats.h"

_Static_assert(STAT_DROP_BAD_TCP_DATA_OFFSET - STAT_DROP_TRUNCATED_TCP ==
		       TCP_BAD_DATA_OFFSET - TCP_TRUNCATED,
	       "one STAT_DROP_* per tcp_fault, in its order");

// A packet steering gave to a VIP address (META_TO_VIP) that is not a fragment and that
// the client path left (`refusal`: parse_plain_tcp's answer; for a TCP layout of its,
// vips held no VIP at its address and port): dropped as the core drops it, or LB_HAND_UP
// without a count (ICMP, a well-formed segment with IP options left on, and whatever the
// core drops for another reason first).
static __always_inline int not_a_vip(struct xdp_md *ctx, const struct lb_config *config,
				     __u32 seq, enum plain_refusal refusal)
{
	struct iphdr *ip = (void *)(long)ctx->data + sizeof(struct ethhdr);

	if (plain_tcp_set(refusal)) {
		// Its index of VIPs is the kernel's only if vips holds every one.
		if (config->flags & LB_EVERY_VIP)
			return drop_by_tables(seq, STAT_DROP_VIP_PORT_UNKNOWN);
		return LB_HAND_UP;
	}
	// (ipv4_checked bounds the header too, but not for the verifier, which sees `ip` anew.)
	if (!ipv4_checked(ctx) || (void *)(ip + 1) > (void *)(long)ctx->data_end)
		return LB_HAND_UP;
	if (refusal == PLAIN_LAYOUT) {
		// A TCP segment (a checked IPv4 header of another protocol is PLAIN_NOT_TCP) in a
		// layout the kernel does not take: the core drops it if its TCP header is
		// malformed, whatever its port; else it is the core's (IP options ip_options.h
		// could not lift).
		return drop_bad_tcp_header(ctx, seq);
	}
	if (ip->protocol == IPPROTO_UDP)
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_UDP);
	if (ip->protocol != IPPROTO_ICMP)
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_PROTOCOL);
	return LB_HAND_UP;
}

#endif
