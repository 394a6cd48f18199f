// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The next hop of a server's reply toward its client. The control plane mirrors the
// kernel's routes and neighbours into next_hops and next_hop_hosts
// (crates/daemon/src/dataplane/next_hops.rs), so a reply costs one lookup in a trie of
// routes (plus one hash lookup toward an on-link host); bpf_fib_lookup (about half of the
// reply path's time) runs only where the maps have no answer. Both give the same answer: the map
// holds a positive entry only where the FIB's answer is known to be it, and "ask the FIB"
// entries where a route or neighbour is one the map does not mirror. In front of the trie
// is a per-CPU direct-mapped cache of its answers by client address (maps.h
// next_hop_cache), good for one publication: a reply toward a recent client reads one slot.

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

// A reply's next hop as found before the publish check, and the cache slot it is to be
// remembered in once the packet commits (next_hop_remember).
struct next_hop_found {
	struct next_hop hop;
	struct next_hop_cached *slot; // NULL: nothing to remember (a cache hit, or the FIB's answer)
};

static __always_inline __u32 next_hop_cache_slot(__be32 addr)
{
	return (addr * NEXT_HOP_CACHE_MULTIPLIER) >> (32 - NEXT_HOP_CACHE_BITS);
}

// Fills `found` for `ip`'s destination (egress interface and both MACs, as bpf_fib_lookup
// gives them), read under the publication `seq`: 1, or 0 when the FIB has no usable answer
// either (the packet goes up). Writes no map but the counters.
//
// The cache first: a slot holds what next_hops answered for its address under one
// publication, so it is that answer while publish_seq has not moved (the copy read under
// it is rewritten only after the word moved on: publish.h). Its MTU is checked per packet as the trie's is; a
// zeroed slot's MTU 0 refuses every packet, so an unfilled slot never answers.
static __always_inline int next_hop_toward_client(struct xdp_md *ctx, const struct iphdr *ip,
						  __u32 len, __u32 copy, __u32 seq,
						  struct next_hop_found *found)
{
	__u32 slot = next_hop_cache_slot(ip->daddr);
	struct next_hop_cached *cached = bpf_map_lookup_elem(&next_hop_cache, &slot);
	struct next_hop_key key = { .prefixlen = 64, .copy = copy, .addr = ip->daddr };
	struct next_hop_host_key host = { .addr = ip->daddr, .copy = copy };
	struct next_hop *known;
	struct bpf_fib_lookup *fib;
	__u32 zero = 0;

	found->slot = NULL;
	if (cached && cached->addr == ip->daddr && cached->seq == seq && len <= cached->hop.mtu) {
		found->hop = cached->hop;
		return 1;
	}
	count(STAT_NEXT_HOP_CACHE_MISS);
	known = bpf_map_lookup_elem(&next_hops, &key);
	if (known && known->kind == NEXT_HOP_ON_LINK)
		known = bpf_map_lookup_elem(&next_hop_hosts, &host);
	// Longer than the route's MTU: the FIB's answer is FRAG_NEEDED, which it must give.
	if (known && known->kind == NEXT_HOP_KNOWN && len <= known->mtu) {
		found->hop = *known;
		found->slot = cached;
		return 1;
	}
	count(STAT_NEXT_HOP_MISS);
	// The FIB's answers are not remembered: no publication tells when they change.
	fib = bpf_map_lookup_elem(&fib_scratch, &zero);
	if (!fib || fib_toward_client(ctx, ip, len, fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	found->hop.ifindex = fib->ifindex;
	__builtin_memcpy(found->hop.dmac, fib->dmac, ETH_ALEN);
	__builtin_memcpy(found->hop.smac, fib->smac, ETH_ALEN);
	return 1;
}

// Remembers a next hop next_hops gave, after the publish check: the answer was read under
// `seq`, which publish_unchanged has just confirmed. A publication that begins after the
// check moves the word, so the slot is void before it could answer for the new maps.
static __always_inline void next_hop_remember(const struct next_hop_found *found, __be32 addr,
					      __u32 seq)
{
	struct next_hop_cached *slot = found->slot;

	if (slot) {
		slot->addr = addr;
		slot->seq = seq;
		slot->hop = found->hop;
	}
}

#endif
