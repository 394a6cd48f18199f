// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The shared fallback table (crates/core/src/lb/fallback.rs) on the kernel's side: flow ->
// server for connections the cookie cannot route, one table for every CPU and every
// AF_XDP worker, since a connection's SYN-ACK, which teaches it, arrives on another CPU
// than its client's segments. The map `fallback` is the core's sets, mmapped by userspace
// (maps.h): the kernel looks flows up and inserts them with the core's lookup and insert,
// one for one; the other writes stay with the core (a SYN-ACK without timestamps, a
// removed server's entry).
//
// The path: a client's segment to a VIP in cheetah mode whose TCP header has no options
// (no timestamp, so no cookie), as the core's client_path.rs routes it: a SYN is placed
// by the VIP's Maglev table and remembered (STAT_FAST_FALLBACK_SYN*); any other segment
// is looked up: a hit naming a forwarding server with a resolved egress is forwarded
// exactly as the core forwards it (STAT_FAST_CLIENT_FALLBACK), a miss by the Maglev table
// (STAT_FAST_FALLBACK_MISS). A hit naming a server that no longer forwards (the core
// drops it and forgets the entry), a VIP without a published Maglev table and anything
// else go up unchanged.

#ifndef CHEETAH_LIB_FALLBACK_H
#define CHEETAH_LIB_FALLBACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "fast_path.h"
#include "handshakes.h"
#include "maglev.h"
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

// fallback.rs `INSERT_ATTEMPTS`: how many times an insert reads its set again after
// losing a compare-and-swap before it gives the entry up.
#define FALLBACK_INSERT_ATTEMPTS 4

// fallback.rs `Insert`.
enum fallback_insert {
	FALLBACK_ADDED,
	FALLBACK_UPDATED,
	FALLBACK_EVICTED,
	FALLBACK_LOST,
};

// fallback.rs `insert_word`: puts `new` (a valid word) into `set` over the word with its
// tag, else into the first empty way, else over the least recently used way (the first
// of the oldest), each by a compare-and-swap from the word read, so that the kernel and
// the workers race on a set as the workers race among themselves.
static __always_inline enum fallback_insert fallback_insert(struct fallback_set *set, __u64 new)
{
	__u64 tag = new & FALLBACK_TAG_MASK;
	__u64 unit = (new & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT;

	for (int attempt = 0; attempt < FALLBACK_INSERT_ATTEMPTS; attempt++) {
		__u64 oldest_word = 0, oldest_age = 0, expected;
		int empty = -1, oldest = -1, lost = 0, way;
		enum fallback_insert outcome;

#pragma unroll
		for (int i = 0; i < FALLBACK_WAYS; i++) {
			__u64 word = *(volatile __u64 *)&set->way[i];
			__u64 age;

			if (!(word & FALLBACK_VALID)) {
				if (empty < 0)
					empty = i;
				continue;
			}
			if ((word & FALLBACK_TAG_MASK) == tag) {
				if (word == new ||
				    __sync_val_compare_and_swap(&set->way[i], word, new) == word)
					return FALLBACK_UPDATED;
				lost = 1;
				break;
			}
			age = (unit - ((word & FALLBACK_TIME_MASK) >> FALLBACK_TIME_SHIFT)) & 0xffff;
			if (oldest < 0 || age > oldest_age) {
				oldest = i;
				oldest_word = word;
				oldest_age = age;
			}
		}
		if (lost)
			continue;
		if (empty >= 0) {
			way = empty;
			expected = 0;
			outcome = FALLBACK_ADDED;
		} else {
			way = oldest;
			expected = oldest_word;
			outcome = FALLBACK_EVICTED;
		}
		if (__sync_val_compare_and_swap(&set->way[way & (FALLBACK_WAYS - 1)], expected,
						new) == expected)
			return outcome;
	}
	return FALLBACK_LOST;
}

// fallback.rs `pack`: the word remembering server `id` for the flow `hash`, used at `now`.
static __always_inline __u64 fallback_word(__u64 hash, __u32 id, __u64 now)
{
	return FALLBACK_VALID | (((__u64)id & FALLBACK_SERVER_MASK) << FALLBACK_SERVER_SHIFT) |
	       (((now >> FALLBACK_TIME_UNIT_SHIFT) & 0xffff) << FALLBACK_TIME_SHIFT) |
	       (hash >> 32);
}

// client_path.rs for a client SYN without TCP options (so without a timestamp) in cheetah
// mode: the VIP's Maglev table places it, `remember` puts it in the fallback table
// (FallbackConnections, and FallbackEvictions when a flow had to go), `loads.on_new_connection`
// counts it (server_traffic.opened) and `count_once_per_handshake` books it, as syn_fast
// books a SYN with a timestamp; then `forward_to_server`. A VIP without a published
// Maglev table goes up.
static __always_inline int fallback_syn(struct xdp_md *ctx, const struct lb_config *config,
					__u32 seq, const struct plain_tcp *p,
					const struct vip_info *vip, __u64 hash)
{
	__u32 zero = 0, set_index = (__u32)hash & config->fallback_mask, id, previous, stat;
	struct handshake_words *words;
	struct server_traffic *traffic;
	struct fallback_set *set;
	struct server_info *server;
	struct toward_server to;
	int evicted, retransmitted;
	__u64 now;

	// Decide: every read, no write.
	if (!maglev_lookup(config, vip->index, hash, &id))
		return hand_up(STAT_UP_OTHER);
	server = bpf_map_lookup_elem(&servers, &id);
	if (!server || !(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	words = bpf_map_lookup_elem(&handshakes, &zero);
	set = bpf_map_lookup_elem(&fallback, &set_index);
	if (!words || !set)
		return hand_up(STAT_UP_OTHER);
	toward_server_of(&to, config, vip, server, id);
	now = core_now(config);
	if (!publish_unchanged(config, seq))
		return hand_up(STAT_UP_PUBLISHING);
	// Commit: remembered, counted and booked, then the bytes.
	evicted = fallback_insert(set, fallback_word(hash, id, now)) == FALLBACK_EVICTED;
	traffic = bpf_map_lookup_elem(&server_traffic, &id);
	if (traffic)
		traffic->opened += 1;
	retransmitted = handshake_on_syn(words, hash, bpf_ntohl(p->tcp->seq), id, now, &previous);
	if (retransmitted) {
		// `loads.on_syn_retransmitted(previous)`, folded by userspace as a counted close.
		traffic = bpf_map_lookup_elem(&server_traffic, &previous);
		if (traffic)
			traffic->closed += 1;
	}
	if (evicted)
		stat = retransmitted ? STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED :
				       STAT_FAST_FALLBACK_SYN_EVICTED;
	else
		stat = retransmitted ? STAT_FAST_FALLBACK_SYN_RETRANSMITTED : STAT_FAST_FALLBACK_SYN;
	return forward_to_server(ctx, p, &to, stat);
}

// client_path.rs for a client segment (not a SYN) without TCP options that the fallback
// table does not know: FallbackMisses, and the VIP's Maglev table places it. A VIP
// without a published table goes up as the miss it is.
static __always_inline int fallback_miss(struct xdp_md *ctx, const struct lb_config *config,
					 __u32 seq, const struct plain_tcp *p,
					 const struct vip_info *vip, __u64 hash)
{
	struct server_info *server;
	struct toward_server to;
	__u32 id;

	if (!maglev_lookup(config, vip->index, hash, &id))
		return hand_up(STAT_UP_FALLBACK_MISS);
	server = bpf_map_lookup_elem(&servers, &id);
	if (!server || !(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	toward_server_of(&to, config, vip, server, id);
	if (!publish_unchanged(config, seq))
		return hand_up(STAT_UP_PUBLISHING);
	return forward_to_server(ctx, p, &to, STAT_FAST_FALLBACK_MISS);
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
	__u8 flags = tcp_flags(p->tcp);
	__u64 hash, now;
	__u32 id;

	// The baselines route it by their pick on the core's general path: not the straight
	// line's layout.
	if (config->mode != LB_MODE_CHEETAH)
		return hand_up(STAT_UP_LAYOUT);
	hash = siphash_finish(vip->hash_prefix, p->ip->saddr, p->tcp->source);
	// SegmentKind::Syn; a SYN-ACK from a client is looked up like any other segment.
	if ((flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
		return fallback_syn(ctx, config, seq, p, vip, hash);
	if (!fallback_find(config, hash, &hit))
		return fallback_miss(ctx, config, seq, p, vip, hash);
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
