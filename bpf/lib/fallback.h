// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The shared fallback table (crates/core/src/lb/fallback.rs) on the kernel's side: flow ->
// server for connections the cookie cannot route, one table for every CPU and every
// AF_XDP worker, since a connection's SYN-ACK, which teaches it, arrives on another CPU
// than its client's segments. The map `fallback` is the core's sets, mmapped by userspace
// (maps.h): the kernel looks flows up with the core's lookup, one for one; inserts and
// removals stay with the core (a SYN's Maglev pick, a SYN-ACK without timestamps, a
// removed server's entry).
//
// The path: a client's segment to a VIP in cheetah mode whose TCP header has no options
// (no timestamp, so no cookie) and which is not a SYN, as the core's client_path.rs routes
// it: a hit naming a forwarding server with a resolved egress is forwarded here exactly as
// the core forwards it (STAT_FAST_CLIENT_FALLBACK); a miss (STAT_UP_FALLBACK_MISS), a hit
// naming a server that no longer forwards (the core drops it and forgets the entry) and
// anything else go up unchanged.

#ifndef CHEETAH_LIB_FALLBACK_H
#define CHEETAH_LIB_FALLBACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "fast_path.h"
#include "maps.h"
#include "parse.h"
#include "publish.h"
#include "siphash.h"
#include "stats.h"

// A word: valid:1 | reserved:1 | server:14 | time:16 | tag:32 (fallback.rs `pack`).
#define FALLBACK_VALID (1ULL << 63)
#define FALLBACK_SERVER_SHIFT 48
#define FALLBACK_SERVER_MASK 0x3fffULL
#define FALLBACK_TIME_SHIFT 32
#define FALLBACK_TIME_MASK (0xffffULL << FALLBACK_TIME_SHIFT)
#define FALLBACK_TAG_MASK 0xffffffffULL
// The time field counts units of 2^30 ns (1.07 s).
#define FALLBACK_TIME_UNIT_SHIFT 30

// A flow the table knows: the way it is in and the word read from it.
struct fallback_hit {
	__u64 *way;
	__u64 word;
};

// fallback.rs `lookup` without its write: the first valid word of the flow's set (its
// hash's low bits) holding the flow's tag (its hash's high half). The set is one entry of
// the map, so the 8 ways are one lookup and one cache line.
static __always_inline int fallback_find(const struct lb_config *config, __u64 hash,
					 struct fallback_hit *hit)
{
	__u32 set = (__u32)hash & config->fallback_mask;
	__u64 tag = hash >> 32;
	struct fallback_set *ways = bpf_map_lookup_elem(&fallback, &set);

	if (!ways)
		return 0;
#pragma unroll
	for (int i = 0; i < FALLBACK_WAYS; i++) {
		__u64 word = *(volatile __u64 *)&ways->way[i];

		if ((word & FALLBACK_VALID) && (word & FALLBACK_TAG_MASK) == tag) {
			hit->way = &ways->way[i];
			hit->word = word;
			return 1;
		}
	}
	return 0;
}

static __always_inline __u32 fallback_server(__u64 word)
{
	return (word >> FALLBACK_SERVER_SHIFT) & FALLBACK_SERVER_MASK;
}

// fallback.rs `lookup`'s write: the word's time becomes `now`'s unit only when the unit
// changed, so a busy flow writes its shared line about once a second; by a
// compare-and-swap from the word read, which loses only to another CPU's or worker's write
// (one as recent).
static __always_inline void fallback_touch(const struct fallback_hit *hit, __u64 now)
{
	__u64 unit = (now >> FALLBACK_TIME_UNIT_SHIFT) & 0xffff;
	__u64 word = hit->word;

	if (((word & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT) != unit)
		__sync_val_compare_and_swap(hit->way, word,
					    (word & ~FALLBACK_TIME_MASK) | (unit << FALLBACK_TIME_SHIFT));
}

// client_path.rs for a client segment whose TCP header has no options (PLAIN_NO_OPTIONS)
// to TCP VIP `vip` (client_vip); `seq` is what publish_begin said before lb_config and vip
// were read.
static __always_inline int client_fallback(struct xdp_md *ctx, const struct lb_config *config,
					   __u32 seq, const struct plain_tcp *p,
					   const struct vip_info *vip)
{
	struct fallback_hit hit = {};
	struct toward_server to;
	struct server_info *server;
	__u64 hash, now;
	__u32 id;

	// The baselines route it by their pick on the core's general path: not the straight
	// line's layout.
	if (config->mode != LB_MODE_CHEETAH)
		return hand_up(STAT_UP_LAYOUT);
	// A SYN without timestamps is placed by Maglev and remembered: userspace.
	if (tcp_flags(p->tcp) & TCP_SYN)
		return hand_up(STAT_UP_NEW_CONNECTION);
	hash = siphash_finish(vip->hash_prefix, p->ip->saddr, p->tcp->source);
	if (!fallback_find(config, hash, &hit))
		return hand_up(STAT_UP_FALLBACK_MISS);
	id = fallback_server(hit.word);
	server = bpf_map_lookup_elem(&servers, &id);
	// A removed server: the core drops the segment and forgets the flow.
	if (!server || !(server->flags & SERVER_FORWARDS))
		return hand_up(STAT_UP_COOKIE);
	if (!(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	toward_server_of(&to, config, vip, server, id);
	// CLOCK_MONOTONIC as of the last tick (a few ms behind at most; a time unit is
	// 1.07 s): bpf_ktime_get_ns cost this path about 29 ns a packet here
	// (docs/benchmarks.md), the coarse read next to nothing.
	now = bpf_ktime_get_coarse_ns() - config->clock_base_ns;
	if (!publish_unchanged(config, seq))
		return hand_up(STAT_UP_PUBLISHING);
	fallback_touch(&hit, now);
	return forward_to_server(ctx, p, &to, STAT_FAST_CLIENT_FALLBACK);
}

#endif
