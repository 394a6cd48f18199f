// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The next hop of a server's reply toward its client. The control plane mirrors the
// kernel's routes and neighbours into next_hops and next_hop_hosts
// (crates/daemon/src/dataplane/next_hops.rs), so a reply costs one lookup in a trie of
// routes (plus one hash lookup toward an on-link host); bpf_fib_lookup (about half of the
// reply path's time) runs only where the maps have no answer. Both give the same answer: the map
// holds a positive entry only where the FIB's answer is known to be it, and "ask the FIB"
// entries where a route or neighbour is one the map does not mirror.

#ifndef CHEETAH_LIB_NEXT_HOP_H
#define CHEETAH_LIB_NEXT_HOP_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"
#include "stats.h"
#include "steer.h"

// Fills `hop` (egress interface and both MACs, as bpf_fib_lookup gives them) for `ip`'s
// destination: 1, or 0 when the FIB has no usable answer either (the packet goes up).
static __always_inline int next_hop_toward_client(struct xdp_md *ctx, const struct iphdr *ip,
						  struct next_hop *hop)
{
	struct next_hop_key key = { .prefixlen = 32, .addr = ip->daddr };
	struct next_hop *known = bpf_map_lookup_elem(&next_hops, &key);
	struct bpf_fib_lookup fib;

	if (known && known->kind == NEXT_HOP_ON_LINK)
		known = bpf_map_lookup_elem(&next_hop_hosts, &ip->daddr);
	// Longer than the route's MTU: the FIB's answer is FRAG_NEEDED, which it must give.
	if (known && known->kind == NEXT_HOP_KNOWN && bpf_ntohs(ip->tot_len) <= known->mtu) {
		*hop = *known;
		return 1;
	}
	count(STAT_NEXT_HOP_MISS);
	if (fib_toward_client(ctx, ip, &fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	hop->ifindex = fib.ifindex;
	__builtin_memcpy(hop->dmac, fib.dmac, ETH_ALEN);
	__builtin_memcpy(hop->smac, fib.smac, ETH_ALEN);
	return 1;
}

#endif
