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
#include "fallback_table.h"
#include "fast_path.h"
#include "handshakes.h"
#include "load_view.h"
#include "maglev.h"
#include "maps.h"
#include "parse.h"
#include "publish.h"
#include "siphash.h"
#include "stats.h"

// client_path.rs for a client SYN without TCP options (so without a timestamp) in cheetah
// mode: the VIP's Maglev table places it, `remember` puts it in the fallback table
// (FallbackConnections, and FallbackEvictions when a flow had to go), `loads.on_new_connection`
// counts it (server_traffic.opened) and `count_once_per_handshake` books it, as syn_fast
// books a SYN with a timestamp; then `forward_to_server`. An empty pool drops it
// (`no_server_available`); a VIP without a published Maglev table goes up.
static __always_inline int fallback_syn(struct xdp_md *ctx, const struct lb_config *config,
					__u32 seq, const struct plain_tcp *p,
					const struct vip_info *vip, __u64 hash)
{
	__u32 zero = 0, set_index = (__u32)hash & config->fallback_mask, id, previous, stat;
	struct handshake_words *words;
	struct fallback_set *set;
	struct server_info *server;
	struct toward_server to;
	int evicted, retransmitted;
	__u64 now;

	// Decide: every read, no write.
	if (vip->policy == KERNEL_POLICY_EMPTY)
		return drop_by_tables(seq, STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN);
	if (!maglev_lookup(config, vip->index, hash, &id))
		return hand_up(STAT_UP_OTHER);
	server = server_at(config->copy, id);
	if (!server || !(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	words = bpf_map_lookup_elem(&handshakes, &zero);
	set = bpf_map_lookup_elem(&fallback, &set_index);
	if (!words || !set)
		return hand_up(STAT_UP_OTHER);
	toward_server_of(&to, config, vip, server, id);
	now = core_now(config);
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	// Commit: remembered, counted and booked, then the bytes.
	evicted = fallback_insert(set, fallback_word(hash, id, now)) == FALLBACK_EVICTED;
	count_opened(bpf_map_lookup_elem(&server_traffic, &id), id);
	retransmitted = handshake_on_syn(words, hash, bpf_ntohl(p->tcp->seq), id, now, &previous);
	// `loads.on_syn_retransmitted(previous)`, folded by userspace as a counted close.
	if (retransmitted)
		count_released(bpf_map_lookup_elem(&server_traffic, &previous), previous);
	if (evicted)
		stat = retransmitted ? STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED :
				       STAT_FAST_FALLBACK_SYN_EVICTED;
	else
		stat = retransmitted ? STAT_FAST_FALLBACK_SYN_RETRANSMITTED : STAT_FAST_FALLBACK_SYN;
	return forward_to_server(ctx, p, &to, stat);
}

// client_path.rs for a client segment (not a SYN) without TCP options that the fallback
// table does not know: FallbackMisses, and the VIP's Maglev table places it. An empty
// pool drops it (`no_server_available`); a VIP without a published table goes up as the
// miss it is.
static __always_inline int fallback_miss(struct xdp_md *ctx, const struct lb_config *config,
					 __u32 seq, const struct plain_tcp *p,
					 const struct vip_info *vip, __u64 hash)
{
	struct server_info *server;
	struct toward_server to;
	__u32 id;

	if (vip->policy == KERNEL_POLICY_EMPTY)
		return drop_by_tables(seq, STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS);
	if (!maglev_lookup(config, vip->index, hash, &id))
		return hand_up(STAT_UP_FALLBACK_MISS);
	server = server_at(config->copy, id);
	if (!server || !(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	toward_server_of(&to, config, vip, server, id);
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	return forward_to_server(ctx, p, &to, STAT_FAST_FALLBACK_MISS);
}

// client_path.rs for a client segment without a timestamp option (a TCP header without
// options, PLAIN_NO_OPTIONS, or options timestamp_walk found none in: the same counts)
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
	server = server_at(config->copy, id);
	// Its server was removed (or the id names none): the connection is gone, as for a
	// cookie naming a removed server. The core drops the segment and forgets the flow,
	// so a flood of the dead connection's segments costs one lookup each, not a worker.
	if (!server || !(server->flags & SERVER_FORWARDS)) {
		if (!publish_unchanged(seq))
			return hand_up(STAT_UP_PUBLISHING);
		fallback_remove(config, hash);
		count(STAT_DROP_FALLBACK_SERVER_REMOVED);
		return XDP_DROP;
	}
	if (!(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	toward_server_of(&to, config, vip, server, id);
	// CLOCK_MONOTONIC as of the last tick (a few ms behind at most; a time unit is
	// 1.07 s): bpf_ktime_get_ns cost this path about 29 ns a packet here
	// (docs/benchmarks.md), the coarse read next to nothing.
	now = bpf_ktime_get_coarse_ns() - config->clock_base_ns;
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	fallback_touch(&hit, now);
	return forward_to_server(ctx, p, &to, STAT_FAST_CLIENT_FALLBACK);
}

#endif
