// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// cheetah's XDP program. With the in-kernel path off it steers the packets the load
// balancer owns to its AF_XDP sockets and everything else to the host kernel (lib/steer.h);
// with it on ([daemon] datapath = "xdp"), it forwards established client segments and
// server replies itself, byte for byte as the core would (lib/fast_path.h), and steers the
// rest. The program is lib/lb.h's `lb_process`; the library under lib/ is split by
// concern: parse.h, csum.h, siphash.h, cookie.h, closes.h, maps.h, stats.h, steer.h,
// next_hop.h, fast_path.h, icmp_path.h.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/lb.h"

SEC("xdp")
int cheetah_lb(struct xdp_md *ctx)
{
	return lb_process(ctx);
}

char LICENSE[] SEC("license") = "GPL";
