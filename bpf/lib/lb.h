// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The whole LB program as one inline function, so that bpf/xdp_lb.c is only its section
// and the bench wrapper (bpf/xdp_bench.c) runs exactly the same code.
//
// Every packet is first classified as steering always did (a VIP's client segment, a
// server's reply, or the host's). With lb_config's LB_FAST_PATH set, the kernel forwards
// what the core's straight line would (fast_path.h); everything else, and everything when
// the flag is clear (lb_config as loaded is all zero), goes to the AF_XDP sockets exactly
// as before (steer.h).

#ifndef CHEETAH_LIB_LB_H
#define CHEETAH_LIB_LB_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "fast_path.h"
#include "maps.h"
#include "steer.h"

static __always_inline int lb_process(struct xdp_md *ctx)
{
	struct backend_info *backend;
	struct lb_config *config;
	__u32 owner = steer_owner(ctx, &backend);
	__u32 zero = 0;
	int action;

	if (!owner)
		return pass();
	config = bpf_map_lookup_elem(&lb_config, &zero);
	if (config && (config->flags & LB_FAST_PATH)) {
		if (owner & META_TO_VIP)
			action = client_fast(ctx, config);
		else
			action = reply_fast(ctx, config, backend);
		if (action != LB_HAND_UP)
			return action;
	}
	return steer_to_socket(ctx, owner);
}

#endif
