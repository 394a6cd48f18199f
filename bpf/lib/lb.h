// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The whole LB program as one inline function, so that bpf/xdp_lb.c is only its section
// and the bench wrapper (bpf/xdp_bench.c) runs exactly the same code.
//
// Every packet is first classified as steering always did (a VIP's client segment, a
// server's reply, or the host's). With lb_config's LB_FAST_PATH set, the kernel forwards
// what the core's straight line would (fast_path.h), a client's SYN as the core places it
// (client_syn.h) and the client segments without options (fallback.h); everything else, and everything when
// the flag is clear (lb_config as loaded is all zero), goes to the AF_XDP sockets exactly
// as before (steer.h). A packet to a VIP address that is not TCP may be an ICMP error the
// kernel routes by its quoted cookie (icmp_path.h).

#ifndef CHEETAH_LIB_LB_H
#define CHEETAH_LIB_LB_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "client_syn.h"
#include "fallback.h"
#include "fast_path.h"
#include "icmp_path.h"
#include "maps.h"
#include "publish.h"
#include "steer.h"

static __always_inline int lb_process(struct xdp_md *ctx)
{
	enum plain_refusal refusal = PLAIN_LAYOUT;
	struct backend_info *backend;
	struct vip_info *vip = NULL;
	struct lb_config *config;
	// Set on every path: clang may carry its fields in registers the verifier must see written.
	struct plain_tcp p = {};
	__u32 zero = 0, owner, seq = 0;
	int fast, action;

	config = bpf_map_lookup_elem(&lb_config, &zero);
	if (config)
		seq = publish_begin(config);
	fast = config && (config->flags & LB_FAST_PATH);
	if (fast) {
		// A client's segment is recognised by its VIP (address, port) alone: vips only
		// holds what vip_addrs holds (the publisher keeps it so), so a hit is a packet
		// steering would call META_TO_VIP, and one hash lookup replaces two.
		refusal = parse_plain_tcp(ctx, &p);
		if (refusal == PLAIN_OK || refusal == PLAIN_NO_OPTIONS)
			vip = client_vip(&p);
		if (vip) {
			// No options, so no timestamp: the fallback table routes it (fallback.h).
			if (refusal == PLAIN_NO_OPTIONS)
				action = client_fallback(ctx, config, seq, &p, vip);
			else if (is_client_syn(config, &p))
				action = client_syn(ctx, config, seq, &p, vip);
			else
				action = client_fast(ctx, config, seq, &p, vip);
			if (action != LB_HAND_UP)
				return action;
		}
	}
	owner = steer_owner(ctx, &backend);
	if (!owner)
		return pass();
	if (fast && !vip) {
		if (owner & META_TO_VIP && refusal == PLAIN_NOT_TCP)
			action = icmp_fast(ctx, config, seq);
		else if (owner & META_TO_VIP)
			action = client_not_found(refusal);
		else
			action = reply_fast(ctx, config, seq, backend, &p, refusal);
		if (action != LB_HAND_UP)
			return action;
	}
	return steer_to_socket(ctx, owner);
}

#endif
