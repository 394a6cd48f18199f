// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The in-kernel straight lines, held byte for byte to the core's
// (crates/core/src/lb/fast_path.rs): a client's established segment to a VIP (cookie
// decoded from TSecr, TSecr restored, toward the server; or, in hash mode, `pool[h % n]`,
// in maglev mode the VIP's Maglev table)
// and a server's reply (clock checked, cookie written into TSval, NAT undone, toward the
// client); and, beyond the core's straight line, a client's SYN placed by the VIP's policy
// as the core's general client path places it (syn_fast). Each either forwards the packet itself, its bytes exactly what the core (plus
// the AF_XDP worker's egress step) would send, or returns LB_HAND_UP, having counted one
// STAT_UP_* reason and changed no byte: userspace then decides, as it always did.
//
// Whatever would change state the kernel does not share with the core, a policy it does
// not run, a server clock the core would not learn,
// or what the maps do not answer (a server without a resolved egress, a FIB miss) goes up.
// A server's close is booked in the kernel, in the close filter it shares with the core
// (closes.h); a server's clock that moved forward is learnt there, in the clock words it
// shares with the core (clock_learn.h).

#ifndef CHEETAH_LIB_FAST_PATH_H
#define CHEETAH_LIB_FAST_PATH_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "clock_learn.h"
#include "closes.h"
#include "cookie.h"
#include "load_view.h"
#include "csum.h"
#include "fallback_table.h"
#include "handshakes.h"
#include "maglev.h"
#include "maps.h"
#include "next_hop.h"
#include "parse.h"
#include "policy.h"
#include "pool.h"
#include "publish.h"
#include "schedule.h"
#include "siphash.h"
#include "stats.h"
#include "steer.h"

// Not an XDP action: the packet goes on to steering, unchanged.
#define LB_HAND_UP (-1)

static __always_inline int hand_up(__u32 reason)
{
	count(reason);
	return LB_HAND_UP;
}

// A segment whose TCP options the core drops (parse.h timestamp_malformed: `found` is the
// walk's code) dropped here, counted under the core's reason: a flood of malformed options
// costs the kernel's walk, not a trip to userspace each.
// `first` is the entry of the first reason: STAT_DROP_TCP_OPTION_TRUNCATED for a client's
// segment, STAT_DROP_SERVER_TCP_OPTION_TRUNCATED for a server's reply.
_Static_assert(STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH - STAT_DROP_TCP_OPTION_TRUNCATED ==
			       TIMESTAMP_OPTION_TRUNCATED - TIMESTAMP_BAD_LENGTH &&
		       STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH -
				       STAT_DROP_SERVER_TCP_OPTION_TRUNCATED ==
			       TIMESTAMP_OPTION_TRUNCATED - TIMESTAMP_BAD_LENGTH,
	       "one STAT_DROP_* per malformed code of the options' walk, in its order");

static __always_inline int drop_malformed_options(__u32 first, int found)
{
	count(first + (TIMESTAMP_OPTION_TRUNCATED - found));
	return XDP_DROP;
}

// A packet steering gave the LB (an owner) whose IPv4 header the core refuses before
// anything else: dropped here under the core's reason; LB_HAND_UP if the header is one it
// accepts, or the frame no IPv4 one.
_Static_assert(STAT_DROP_BAD_IPV4_TOTAL_LENGTH - STAT_DROP_BAD_IP_VERSION ==
		       IPV4_BAD_TOTAL_LENGTH - IPV4_BAD_VERSION,
	       "one STAT_DROP_* per ipv4_fault, in its order");

static __always_inline int drop_bad_ipv4_header(struct xdp_md *ctx)
{
	enum ipv4_fault fault;

	if (!untagged_ipv4(ctx))
		return LB_HAND_UP;
	fault = ipv4_header_fault(ctx);
	// A frame too short for an IP header has no destination steering could own it by.
	if (fault == IPV4_CHECKED || fault == IPV4_TRUNCATED)
		return LB_HAND_UP;
	count(STAT_DROP_BAD_IP_VERSION + (fault - IPV4_BAD_VERSION));
	return XDP_DROP;
}

// A drop decided on the published tables read under `seq` (whose VIP or server a packet
// is): counted under `stat` if no publication moved on meanwhile, else handed up (the
// core decides on one snapshot).
static __always_inline int drop_by_tables(__u32 seq, __u32 stat)
{
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	count(stat);
	return XDP_DROP;
}

// A segment dropped under its TCP header's fault (tcp_header_fault, not TCP_CHECKED).
static __always_inline int drop_tcp_fault(__u32 seq, enum tcp_fault fault)
{
	return drop_by_tables(seq, STAT_DROP_TRUNCATED_TCP + (fault - TCP_TRUNCATED));
}

// A TCP segment of an ipv4_checked frame whose header the core's `TcpSegment::new_checked`
// refuses, dropped under its fault (tcp_header_fault); LB_HAND_UP for a sound header.
static __always_inline int drop_bad_tcp_header(struct xdp_md *ctx, __u32 seq)
{
	enum tcp_fault fault = tcp_header_fault(ctx);

	if (fault == TCP_CHECKED)
		return LB_HAND_UP;
	return drop_tcp_fault(seq, fault);
}

static __always_inline int hand_up_refused(enum plain_refusal refusal)
{
	return hand_up(refusal == PLAIN_NOT_TCP ? STAT_UP_OTHER : STAT_UP_LAYOUT);
}

// A packet counted by a STAT_FAST_* entry that stands for OptionsFastPath whose timestamp
// the walk found (timestamp_walk): the core counted OptionsSlowPath in its place.
static __always_inline void count_options_walked(int walked)
{
	if (walked)
		count(STAT_OPTIONS_WALKED);
}

static __always_inline struct cookie_layout layout_of(const struct lb_config *config)
{
	struct cookie_layout layout = { .id_bits = config->id_bits, .id_mask = config->id_mask };

	return layout;
}

// The core's `loads.on_packet(server, IP bytes)`, and with `closed` its counted close
// (`loads.on_server_close`), folded into its loads by userspace. `ip_len`: the IP
// packet's length as it came (parse.h plain_ip_len).
static __always_inline void add_server_traffic(__u32 server, __u32 ip_len, int closed)
{
	struct server_traffic *traffic = bpf_map_lookup_elem(&server_traffic, &server);

	if (traffic) {
		traffic->packets += 1;
		traffic->bytes += ip_len;
	}
	if (closed)
		count_released(traffic, server);
}

// The core's `loads.on_connection_moved(from, to)`: -1 active on `from` (a released count,
// as a counted close is) and +1 on `to` without a new connection, folded by userspace.
static __always_inline void move_count(__u32 from, __u32 to)
{
	count_released(bpf_map_lookup_elem(&server_traffic, &from), from);
	count_moved_in(bpf_map_lookup_elem(&server_traffic, &to), to);
}

// The core's `now` (the daemon's clock, ns since its start), for the handshake table's
// retry marks. The base is set once by the daemon, not by a publication: a plain read.
static __always_inline __u64 core_now(const struct lb_config *config)
{
	return bpf_ktime_get_ns() - config->clock_base_ns;
}

// Whether replies are taken from the interface `ifindex` (server_side, maps.h), in the
// tables' copy `copy`.
static __always_inline int on_server_side(__u32 copy, __u32 ifindex)
{
	__u32 slot = latched_index(copy, ifindex & (SERVER_SIDE_SLOTS - 1), SERVER_SIDE_SLOTS);
	__u32 *owner = bpf_map_lookup_elem(&server_side, &slot);

	return owner && *owner == ifindex;
}

// Server `id`'s entry of servers in the tables' copy `copy` (NULL: beyond the ids).
static __always_inline struct server_info *server_at(__u32 copy, __u32 id)
{
	__u32 key = latched_index(copy, id, SERVER_ID_SPACE);

	return bpf_map_lookup_elem(&servers, &key);
}

static __always_inline int send_out(struct xdp_md *ctx, __u32 egress_ifindex)
{
	if (egress_ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(egress_ifindex, 0);
}

// What forwarding a client's segment writes, read from the published maps before the
// publish check (publish.h) so that nothing is read from them after it.
struct toward_server {
	struct server_info server; // a copy of the servers entry
	__u32 id;
	__u8 forwarding;           // lb_config's
	__be16 vip_port;
	__be16 backend_port;
};

// client_path.rs `forward_to_server_via`'s bytes, plus the egress step the AF_XDP worker
// does after it (source MAC = the egress interface's, egress.rs): the server's MAC, with
// NAT its address and the VIP's backend port. `vip_port` and `backend_port` are the VIP's.
static __always_inline void rewrite_toward_server(const struct plain_tcp *p, int nat,
						  const struct server_info *server, __be16 vip_port,
						  __be16 backend_port)
{
	__builtin_memcpy(p->eth->h_dest, server->dst_mac, ETH_ALEN);
	__builtin_memcpy(p->eth->h_source, server->src_mac, ETH_ALEN);
	if (nat) {
		__be32 old = csum_set_ipv4_addr(&p->ip->check, &p->ip->daddr, server->dip);

		csum_tcp_address_changed(&p->tcp->check, old, server->dip);
		if (backend_port != vip_port)
			csum_set_tcp_port(&p->tcp->check, &p->tcp->dest, backend_port);
	}
}

// client_path.rs `forward_to_server_via` (rewrite_toward_server), the traffic it counts,
// and out.
static __always_inline int forward_to_server(struct xdp_md *ctx, const struct plain_tcp *p,
					     const struct toward_server *to, __u32 stat)
{
	rewrite_toward_server(p, to->forwarding == LB_FORWARDING_NAT, &to->server, to->vip_port,
			      to->backend_port);
	add_server_traffic(to->id, plain_ip_len(p), 0);
	count(stat);
	return send_out(ctx, to->server.egress_ifindex);
}

// The published state forwarding to server `id` (a servers entry) needs.
static __always_inline void toward_server_of(struct toward_server *to,
					     const struct lb_config *config,
					     const struct vip_info *vip,
					     const struct server_info *server, __u32 id)
{
	to->server = *server;
	to->id = id;
	to->forwarding = config->forwarding;
	to->vip_port = vip->port;
	to->backend_port = vip->backend_port;
}

// The TCP VIP a plain segment is addressed to (NULL: none). The client path's first
// and only hash lookup: a hit is a VIP's segment, so steering's vip_addrs is not asked.
static __always_inline struct vip_info *client_vip(__u32 copy, const struct plain_tcp *p)
{
	return tcp_vip_at(copy, p->ip->daddr, p->tcp->dest);
}

// Why a segment to a VIP address that client_vip did not find goes up: as the core's
// client_fast refuses it (not the plain layout, or no TCP VIP on that port).
static __always_inline int client_not_found(enum plain_refusal refusal)
{
	if (refusal != PLAIN_OK)
		return hand_up_refused(refusal);
	return hand_up(STAT_UP_OTHER);
}

// client_path.rs for a client SYN to a cheetah-mode VIP whose timestamp sits where Table 1
// puts it (client_syn.h): `pick_new` (the VIP's policy, +1 active and +1 new connection for the pick:
// server_traffic.opened) and `count_once_per_handshake` (the handshake table; a retransmitted
// SYN releases its earlier pick's count), then `forward_to_server`. An empty pool
// (KERNEL_POLICY_EMPTY) drops it as the core does; a VIP whose policy the kernel does not
// run (vip_info.policy) or an unpublished pool goes up as before.
// maglev reads no pool position: the VIP's Maglev table names the server, for a pool of
// any size (a bigger one is published with pool_len 0).
static __always_inline int syn_fast(struct xdp_md *ctx, const struct lb_config *config,
				    __u32 seq, const struct plain_tcp *p,
				    const struct vip_info *vip, int walked)
{
	__u32 index = vip->index, pool_len = vip->pool_len, policy = vip->policy;
	__u32 latched = latched_index(config->copy, index, MAX_VIPS);
	__u32 zero = 0, position, next_rr = 0, next_cursor = 0, id, previous, stat;
	struct handshake_words *words;
	const struct vip_big_pool *big = NULL;
	const struct server_info *server;
	const struct vip_weights *weights;
	const struct vip_schedule *schedule = NULL;
	struct policy_rng *cpu_rng = NULL;
	struct policy_state *state;
	struct server_info target;
	struct policy_rng rng;
	__be16 vip_port, backend_port;
	__s64 total = 0;
	__u64 hash, now;
	int nat, drawn;

	// Decide: every read, no write. (client_syn found the timestamp where Table 1 puts it,
	// or, `walked`, elsewhere.)
	// wrr and awrr keep per-position state for MAX_HASH_POOL positions: a bigger pool is
	// published with them only when the kernel reads its cycle (then read, not scanned;
	// awrr's always: xdp_tables.rs kernel_policy).
	if (policy == KERNEL_POLICY_EMPTY) {
		if (!publish_unchanged(seq))
			return hand_up(STAT_UP_PUBLISHING);
		count(STAT_DROP_NO_SERVER_AVAILABLE_SYN);
		count_options_walked(walked);
		return XDP_DROP;
	}
	if (policy == KERNEL_POLICY_NONE ||
	    (policy != KERNEL_POLICY_MAGLEV && !vip_pool_open(config->copy, vip, &big)))
		return hand_up(STAT_UP_NEW_CONNECTION);
	state = bpf_map_lookup_elem(&policy_state, &index);
	words = bpf_map_lookup_elem(&handshakes, &zero);
	if (!state || !words)
		return hand_up(STAT_UP_OTHER);
	hash = siphash_finish(vip->hash_prefix, p->ip->saddr, p->tcp->source);
	switch (policy) {
	case KERNEL_POLICY_RR:
		position = rr_decide(state, pool_len, &next_rr);
		break;
	case KERNEL_POLICY_WRR:
		schedule = bpf_map_lookup_elem(&wrr_schedules, &latched);
		if (schedule) {
			struct schedule_chunk_key chunk_key = {
				.index = index,
				.copy = config->copy,
			};

			drawn = schedule_decide(state, schedule, &chunk_key, pool_len,
						&next_cursor);
			if (drawn < 0)
				return hand_up(STAT_UP_OTHER);
			position = drawn;
			break;
		}
		weights = bpf_map_lookup_elem(&vip_weights, &latched);
		if (!weights || big)
			return hand_up(STAT_UP_OTHER);
		position = wrr_decide(state, weights, pool_len);
		total = weights->total;
		break;
	case KERNEL_POLICY_AWRR:
		schedule = bpf_map_lookup_elem(&awrr_schedules, &index);
		drawn = schedule_decide(state, schedule, NULL, pool_len, &next_cursor);
		if (drawn < 0)
			return hand_up(STAT_UP_OTHER);
		position = drawn;
		break;
	case KERNEL_POLICY_RANDOM:
		cpu_rng = bpf_map_lookup_elem(&policy_rng, &zero);
		if (!cpu_rng)
			return hand_up(STAT_UP_OTHER);
		rng = *cpu_rng;
		drawn = uniform_below(&rng, pool_len);
		if (drawn < 0)
			return hand_up(STAT_UP_NEW_CONNECTION);
		position = drawn;
		break;
	case KERNEL_POLICY_HASH:
		position = hash % pool_len;
		break;
	case KERNEL_POLICY_POW2: {
		__u32 first, second, first_id, second_id;
		__u64 first_load, second_load;
		struct load_view view = {};

		// pow2.rs: one server is the pick, without a draw.
		if (pool_len == 1) {
			position = 0;
			break;
		}
		cpu_rng = bpf_map_lookup_elem(&policy_rng, &zero);
		if (!cpu_rng)
			return hand_up(STAT_UP_OTHER);
		rng = *cpu_rng;
		if (!pow2_draw(&rng, pool_len, &first, &second))
			return hand_up(STAT_UP_NEW_CONNECTION);
		if (!load_view_open(vip->load_metric, &view))
			return hand_up(STAT_UP_OTHER);
		first_id = vip_pool_member(vip, big, first);
		second_id = vip_pool_member(vip, big, second);
		first_load = view_load(&view, vip->load_metric, first_id);
		second_load = view_load(&view, vip->load_metric, second_id);
		// On equal loads the first drawn wins.
		position = second_load < first_load ? second : first;
		break;
	}
	case KERNEL_POLICY_LEAST_LOADED:
		if (!least_loaded_decide(state, vip, big, pool_len, seq, &position, &next_rr))
			return hand_up(STAT_UP_OTHER);
		break;
	case KERNEL_POLICY_MAGLEV:
		// maglev.rs `MaglevPolicy::pick`; no table (not published yet) goes up, as in
		// fallback_syn.
		if (!maglev_lookup(config, index, hash, &id))
			return hand_up(STAT_UP_OTHER);
		position = 0;
		break;
	default:
		return hand_up(STAT_UP_NEW_CONNECTION);
	}
	if (policy != KERNEL_POLICY_MAGLEV)
		id = vip_pool_member(vip, big, position);
	server = server_at(config->copy, id);
	if (!server || !(server->flags & SERVER_EGRESS))
		return hand_up(STAT_UP_NEXT_HOP);
	target = *server;
	vip_port = vip->port;
	backend_port = vip->backend_port;
	nat = config->forwarding == LB_FORWARDING_NAT;
	now = core_now(config);
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	// Commit: the policy's state moves on, the pick is counted and booked, then the bytes.
	if (policy == KERNEL_POLICY_RR || policy == KERNEL_POLICY_LEAST_LOADED)
		state->rr_position = next_rr;
	else if (policy == KERNEL_POLICY_AWRR || (policy == KERNEL_POLICY_WRR && schedule))
		state->schedule_cursor = next_cursor;
	else if (policy == KERNEL_POLICY_WRR)
		wrr_commit(state, position, total);
	// random, and pow2 when it drew.
	if (cpu_rng)
		*cpu_rng = rng;
	count_opened(bpf_map_lookup_elem(&server_traffic, &id), id);
	stat = STAT_FAST_CLIENT_SYN;
	if (handshake_on_syn(words, hash, bpf_ntohl(p->tcp->seq), id, now, &previous)) {
		// `loads.on_syn_retransmitted(previous)`: -1 active, as a counted close is, and
		// so folded by userspace.
		count_released(bpf_map_lookup_elem(&server_traffic, &previous), previous);
		stat = STAT_FAST_CLIENT_SYN_RETRANSMITTED;
	}
	rewrite_toward_server(p, nat, &target, vip_port, backend_port);
	add_server_traffic(id, plain_ip_len(p), 0);
	count(stat);
	count_options_walked(walked);
	return send_out(ctx, target.egress_ifindex);
}

// cookie_stage.rs `route_by_cookie`: the server an echoed cookie (`echoed`, the 16 bits
// as a number) of the connection with hash `hash` names, with its id and, in *restore,
// cookie_restore's answer: the MSB the echo restores to in *restored, beyond the idle limit
// or not (the caller counts STAT_ECHO_BEYOND_IDLE_LIMIT once it forwards). A `quote` (an
// ICMP error's) whose server's clock is unknown is routed unrestored, as the core's ICMP
// path routes it; a client's echo is dropped. NULL when the kernel does not route it:
// either with *drop the STAT_DROP_* entry of the core's reason, nothing counted yet (a
// cookie naming a server that is not allocated or was removed, or a clock the LB does not
// know), or, *drop 0, left to userspace, having counted why (no resolved egress:
// `next_hop`). Client segments and ICMP errors decode alike.
static __always_inline struct server_info *route_by_cookie(__u32 copy, struct cookie_layout layout,
							   __u16 echoed, __u64 hash, int quote,
							   __u32 *id, __u16 *restored, int *restore,
							   __u32 *drop)
{
	__u16 unmasked = cookie_unmask(layout, echoed, hash);
	struct server_info *server;

	*drop = 0;
	*id = cookie_server(layout, unmasked);
	server = server_at(copy, *id);
	if (!server) {
		hand_up(STAT_UP_COOKIE);
		return NULL;
	}
	if (!(server->flags & SERVER_FORWARDS)) {
		*drop = server->flags & SERVER_REMOVED ? STAT_DROP_COOKIE_SERVER_REMOVED :
							 STAT_DROP_COOKIE_UNKNOWN_SERVER;
		return NULL;
	}
	*restore = cookie_restore(&msb_restores, unmasked, restored);
	if (*restore == COOKIE_CLOCK_UNKNOWN && !quote) {
		*drop = STAT_DROP_TS_MSB_UNKNOWN;
		return NULL;
	}
	if (*restore == COOKIE_FOR_THE_CORE) {
		hand_up(STAT_UP_COOKIE);
		return NULL;
	}
	if (!(server->flags & SERVER_EGRESS)) {
		hand_up(STAT_UP_NEXT_HOP);
		return NULL;
	}
	return server;
}

// fast_path.rs `client_fast`'s cookie stage and forward, for an established segment `p`
// to a cheetah-mode VIP, of which it needs the hash prefix and the ports (from vips or
// vip_slots). The timestamp option starts `at` bytes into the options: 2 when they start
// NOP NOP TS (the straight line), else where timestamp_walk found it (`walked`): then the
// core's general path (client_path.rs) takes the segment, which finds the same server and
// restores TSecr as a whole word at any offset (`rewrite_option_u32`), and counts the walk.
static __always_inline int client_by_cookie(struct xdp_md *ctx, const struct lb_config *config,
					    __u32 seq, const struct plain_tcp *p,
					    const __u64 hash_prefix[4], __be16 vip_port,
					    __be16 backend_port, int at, int walked)
{
	struct toward_server to;
	struct server_info *server;
	__u8 *option = timestamp_option_at(ctx, p, at);
	__u16 restored = 0;
	__u32 id, drop;
	int action, restore;
	// The VIP's side of the id was hashed by userspace (the packet's destination is the
	// VIP's address and port: that is how it was found).
	__u64 hash = siphash_finish(hash_prefix, p->ip->saddr, p->tcp->source);

	if (!option)
		return hand_up(STAT_UP_LAYOUT);
	// The cookie is TSecr's high half.
	server = route_by_cookie(config->copy, layout_of(config),
				 bpf_ntohs(*(__be16 *)(option + TCP_TIMESTAMP_TSECR)), hash, 0, &id,
				 &restored, &restore, &drop);
	if (!server) {
		// A cookie that routes nowhere (forged, or of a removed server or an unknown
		// clock): dropped as the core drops it, its cookie stage's counts first.
		if (!drop)
			return LB_HAND_UP;
		action = drop_by_tables(seq, drop);
		// A walked timestamp is the core's general path, which counts no fast_path.
		if (action == XDP_DROP && walked) {
			count(STAT_OPTIONS_WALKED);
			count(STAT_GENERAL_PATH);
		}
		return action;
	}
	to.server = *server;
	to.id = id;
	to.forwarding = config->forwarding;
	to.vip_port = vip_port;
	to.backend_port = backend_port;
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	if (restore == COOKIE_RESTORED_LATE)
		count(STAT_ECHO_BEYOND_IDLE_LIMIT);
	if (walked) {
		__u8 *tsecr = option + TCP_TIMESTAMP_TSECR;
		__be32 old;

		__builtin_memcpy(&old, tsecr, sizeof(old));
		csum_rewrite_option_u32(tsecr, &p->tcp->check, at & 1,
					(__u32)bpf_ntohs(restored) << 16 | (bpf_ntohl(old) & 0xffff));
		return forward_to_server(ctx, p, &to, STAT_FAST_CLIENT_COOKIE_WALKED);
	}
	// Only the MSB changes: the cookie becomes the server's own MSB, which the table
	// keeps in network byte order.
	csum_replace_high_half_in_network_order((__u16 *)(option + TCP_TIMESTAMP_TSECR),
						&p->tcp->check, restored);
	return forward_to_server(ctx, p, &to, STAT_FAST_CLIENT_COOKIE);
}

// Whether `p` is an established segment in the core's sense (ACK without SYN), whose TSecr
// echoes a cookie if it carries a timestamp.
static __always_inline int established(const struct plain_tcp *p)
{
	return (tcp_flags(p->tcp) & (TCP_SYN | TCP_ACK)) == TCP_ACK;
}

// fast_path.rs `client_fast` for a plain segment `p` to TCP VIP `vip` (client_vip) that
// client_by_cookie does not take (lb.h: in cheetah mode, an ACK with NOP NOP TS goes
// there); `seq` is what publish_begin said before lb_config and vip were read. A baseline's
// pick is counted as `pick_stat`: STAT_FAST_CLIENT_PICK on the straight line's layout,
// STAT_FAST_CLIENT_PICK_GENERAL for a TCP header too short for it (the core's general
// path picks alike but counts only the verdict).
static __always_inline int client_fast(struct xdp_md *ctx, const struct lb_config *config,
				       __u32 seq, const struct plain_tcp *p,
				       const struct vip_info *vip, __u32 pick_stat)
{
	struct toward_server to;
	struct server_info *server;
	__u32 id, stat;
	__u64 hash;

	if (config->mode == LB_MODE_CHEETAH) {
		// A SYN is client_syn's (client_syn.h); a segment without SYN and ACK the
		// fallback table's, a client's SYN-ACK the cookie stage's (lb.h): one that
		// reaches here is one whose options could not be walked.
		if ((tcp_flags(p->tcp) & (TCP_SYN | TCP_ACK)) != TCP_ACK)
			return hand_up(STAT_UP_NEW_CONNECTION);
		// An ACK with a timestamp went to client_by_cookie, one without to client_fallback,
		// one with malformed options was dropped (lb.h): the walk could not run on this one.
		return hand_up(STAT_UP_LAYOUT);
	} else {
		// The baselines: this same path with `pool[h % n]` or the VIP's Maglev table for
		// the cookie stage, for every segment (SYN too), as the core's.
		if (vip->policy == KERNEL_POLICY_EMPTY)
			return drop_by_tables(seq, pick_stat == STAT_FAST_CLIENT_PICK ?
							   STAT_DROP_NO_SERVER_AVAILABLE_PICK :
							   STAT_DROP_NO_SERVER_AVAILABLE);
		hash = siphash_finish(vip->hash_prefix, p->ip->saddr, p->tcp->source);
		if (config->mode == LB_MODE_HASH) {
			const struct vip_big_pool *big;

			if (!vip_pool_open(config->copy, vip, &big))
				return hand_up(STAT_UP_OTHER);
			id = vip_pool_member(vip, big, hash % vip->pool_len);
		} else if (!maglev_lookup(config, vip->index, hash, &id)) {
			// No table: an empty pool (the core drops) or not published yet.
			return hand_up(STAT_UP_OTHER);
		}
		server = server_at(config->copy, id);
		if (!server || !(server->flags & SERVER_EGRESS))
			return hand_up(STAT_UP_NEXT_HOP);
		stat = pick_stat;
	}
	toward_server_of(&to, config, vip, server, id);
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	return forward_to_server(ctx, p, &to, stat);
}

// What a reply decides before its publish check and writes after it, when it learns a
// clock, answers a retried SYN or closes: per CPU, not on the stack, where its 112 bytes
// would stand beside every local of the deepest path (the program and least-loaded's
// callback share 512 bytes). Per packet, but for when this CPU last sent a clock anomaly
// up; nothing worth keeping across a restart: not pinned (pin.rs). A reply takes the
// entry only on those cold branches; the straight line never reads it.
struct reply_cold {
	struct clock_learning learning; // a reply whose MSB moved (clock_learn.h)
	struct handshake_answer answer; // a SYN-ACK that first answers a retried SYN
	struct close close;             // a FIN or an RST (closes.h)
	__u32 clock_sampled_ms;         // the core's `now` (ms) of the last clock_sample_due
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct reply_cold);
} reply_scratch SEC(".maps");

// How often a CPU hands up a reply whose clock the core would not learn.
#define CLOCK_SAMPLE_MS 1000

// Whether a reply whose clock the core would not learn (clock_learn_decide, which set
// `now_ms`) goes up as a sample: the first on this CPU in CLOCK_SAMPLE_MS. The workers
// learn it, count it and log the warning (`MsbTable::unstable`, at most once a minute a
// server); the kernel takes the rest, counted as the core counts them, so a server with a
// broken clock (two clocks behind one address, tcp_timestamps=1) or a flood of spoofed
// replies costs no worker trip a packet.
static __always_inline int clock_sample_due(struct reply_cold *cold)
{
	__u32 now_ms = cold->learning.now_ms;

	if (cold->clock_sampled_ms && now_ms - cold->clock_sampled_ms < CLOCK_SAMPLE_MS)
		return 0;
	cold->clock_sampled_ms = now_ms;
	return 1;
}

// fast_path.rs `reply_fast` for a server's reply from `sender` (reply_sender.h found it:
// a forwarding server, on the servers' side, in the plain layout). `p` is the frame as
// parse_plain_tcp left it; `seq` what publish_begin said before lb_config was read.
static __always_inline int reply_fast(struct xdp_md *ctx, const struct lb_config *config,
				      __u32 seq, const struct reply_sender *sender,
				      const struct plain_tcp *p)
{
	struct next_hop_found hop;
	__be32 vip_addr;
	__be16 vip_port;
	__be32 *tsval = &p->ts->tsval;
	// Where the timestamp option starts within the options, and whether the walk found it.
	int at, walked = 0;
	// The cold branches' state (reply_scratch), taken by the first of them that needs it.
	struct reply_cold *cold = NULL;
	// A FIN or an RST (cheetah mode), and whether it is its connection's first (closes.h).
	int is_close = 0, first_close = 0;
	// A reply whose MSB moved, learnt in the kernel (clock_learn.h).
	int learns = 0;
	// A SYN-ACK without timestamps (cheetah mode): the fallback set it teaches, the word.
	struct fallback_set *teaches = NULL;
	__u64 learned = 0;
	int without_timestamp = 0;
	// A SYN-ACK that first answers a retried SYN: the handshake slot's update (handshakes.h).
	int answers = 0;
	__u16 cookie = 0;
	__u32 id = sender->server, stat;
	int cheetah = config->mode == LB_MODE_CHEETAH;
	int nat = config->forwarding == LB_FORWARDING_NAT;
	// A TCP header too short for the straight line (plain_tcp_set): the core's general
	// server path takes it, which counts no FastPath; its options hold no timestamp.
	int general = !p->ts;

	if (cheetah) {
		struct cookie_layout layout = layout_of(config);
		struct msb_seen_words *seen;
		__u8 flags = tcp_flags(p->tcp);
		__u32 zero = 0, seen_word;
		__u16 msb;
		__u64 hash;

		if (flags & TCP_SYN) {
			// SYN-ACKs and SYNs: Table 1's layouts, TSval 2 bytes into the option. One
			// that also closes is left to userspace whole.
			if (flags & (TCP_FIN | TCP_RST))
				return hand_up(STAT_UP_HANDSHAKE_OR_CLOSE);
			// A header too short for the straight line (only MSS, say) has no room for
			// a timestamp: the walk below finds none, and it teaches the fallback table.
			at = general ? 0 : syn_timestamp_at(ctx, p);
		} else {
			// Also for a FIN or RST, whose close counts with a timestamp or without.
			at = !general && plain_has_nop_nop_ts(p) ? 2 : 0;
		}
		if (!at) {
			// Elsewhere, or none: the core's walk (none over no options).
			at = p->tcp->doff * 4 == sizeof(struct tcphdr) ? TIMESTAMP_NONE :
									  timestamp_walk(ctx, p);
			// Without a timestamp a SYN-ACK teaches the fallback table; any other
			// segment is forwarded without a cookie (server_path.rs), an RST never
			// counted as a close, a FIN's close counted as a stamped one's.
			if (at < TIMESTAMP_NONE) {
				// Malformed: the core drops it, after its server path's count; the
				// general path (a header too short for the straight line) counts
				// nothing first, as the core's drop of a client's options.
				if (timestamp_malformed(at))
					return drop_malformed_options(
						general ? STAT_DROP_TCP_OPTION_TRUNCATED :
							  STAT_DROP_SERVER_TCP_OPTION_TRUNCATED,
						at);
				return hand_up(STAT_UP_LAYOUT);
			}
			without_timestamp = at == TIMESTAMP_NONE;
			walked = !without_timestamp;
		}
		// Hidden from the verifier, so that what follows is verified once for the
		// compares' finds and the walk's, not once for each.
		asm volatile("" : "+r"(at), "+r"(walked));
		if (!without_timestamp) {
			__u8 *option = timestamp_option_at(ctx, p, at);

			if (!option)
				return hand_up(STAT_UP_LAYOUT);
			tsval = (__be32 *)(option + TCP_TIMESTAMP_TSVAL);
		}
		// The connection's hash: its client is the reply's destination.
		hash = siphash_finish(sender->hash_prefix, p->ip->daddr, p->tcp->dest);
		// A server's SYN without ACK (SegmentKind::Syn, a simultaneous open's) answers no
		// SYN: its timestamp, if any, is a reply's like any other, and it neither moves a
		// load count nor teaches the fallback table.
		if ((flags & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK)) {
			struct handshake_words *words = bpf_map_lookup_elem(&handshakes, &zero);

			// The answer to a recently retried SYN may have to move its load count
			// (server_path.rs, handshakes.rs `on_syn_ack`): the first answer marks the
			// slot and takes the count, whatever else it does (a cookie, a clock, the
			// fallback table).
			__u64 now = core_now(config);

			if (!words)
				return hand_up(STAT_UP_HANDSHAKE_OR_CLOSE);
			if (handshake_retried_recently(words, hash, now)) {
				cold = bpf_map_lookup_elem(&reply_scratch, &zero);
				if (!cold)
					return hand_up(STAT_UP_OTHER);
				answers = handshake_answer_decide(words, hash,
								  bpf_ntohl(p->tcp->ack_seq) - 1,
								  id, &cold->answer);
			}
			if (without_timestamp) {
				// server_path.rs: the client offered no timestamp, so its later
				// segments are routed by the fallback table: it learns this server.
				__u32 set = (__u32)hash & config->fallback_mask;

				teaches = bpf_map_lookup_elem(&fallback, &set);
				if (!teaches)
					return hand_up(STAT_UP_OTHER);
				learned = fallback_word(hash, id, now);
			}
		}
		if (!without_timestamp) {
			msb = bpf_ntohl(*tsval) >> 16;
			seen = bpf_map_lookup_elem(&msb_seen, &zero);
			if (!seen)
				return hand_up(STAT_UP_CLOCK);
			seen_word = seen->word[id & (SERVER_ID_SPACE - 1)];
			if (!cookie_clock_unchanged(seen_word, msb)) {
				if (!cold)
					cold = bpf_map_lookup_elem(&reply_scratch, &zero);
				if (!cold)
					return hand_up(STAT_UP_CLOCK);
				learns = clock_learn_decide(&cold->learning, id, bpf_ntohl(*tsval),
							    seen_word, core_now(config), layout);
				if (learns == CLOCK_FOR_USERSPACE ||
				    (learns != CLOCK_LEARNS && clock_sample_due(cold)))
					return hand_up(STAT_UP_CLOCK);
			}
			cookie = cookie_encode(layout, id, hash, msb);
		}
		// closes.rs `on_server_close`, filed under the connection's hash, with or without
		// a timestamp. Cheetah mode only: the baselines place no connection by a policy,
		// so they count no close either. An RST without a timestamp is no close
		// (`resets_without_timestamp`), with FIN too: RST wins.
		if ((flags & (TCP_FIN | TCP_RST)) && !((flags & TCP_RST) && without_timestamp)) {
			struct close_words *words = bpf_map_lookup_elem(&closes, &zero);
			// parse_plain_tcp proved IP + TCP header <= total length.
			__u32 data_len = bpf_ntohs(p->ip->tot_len) - sizeof(struct iphdr) -
					 p->tcp->doff * 4;

			if (!cold)
				cold = bpf_map_lookup_elem(&reply_scratch, &zero);
			if (!words || !cold)
				return hand_up(STAT_UP_OTHER);
			is_close = 1;
			first_close = close_seen(words, hash, flags, bpf_ntohl(p->tcp->seq),
						 data_len, &cold->close);
		}
	}

	// Before any byte changes: no next hop (map and FIB both) hands the packet up as it
	// came, with the metadata steering writes for the worker's neighbour lookup.
	if (!next_hop_toward_client(ctx, p->ip, plain_ip_len(p), config->copy, seq, &hop))
		return hand_up(STAT_UP_NEXT_HOP);
	vip_addr = sender->vip_addr;
	vip_port = sender->vip_port;
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	// The first write: a clock another writer moved meanwhile goes up, nothing written.
	// Then the handshake slot: one another writer moved goes up too, for the workers to
	// decide afresh, the clock as this reply left it (so the core finds it unchanged and
	// only that learn's count is lost, in a race of two answers within microseconds).
	// The other order could not go up: a slot marked answered moves no count again.
	if (clock_decision_writes(learns) && cold && !clock_learn_commit(&cold->learning))
		return hand_up(STAT_UP_CLOCK);
	if (answers && cold && !handshake_answer_commit(&cold->answer))
		return hand_up(STAT_UP_HANDSHAKE_OR_CLOSE);
	next_hop_remember(&hop, p->ip->daddr, seq);

	if (teaches) {
		stat = fallback_insert(teaches, learned) == FALLBACK_EVICTED ?
			       STAT_FAST_SERVER_FALLBACK_LEARNED_EVICTED :
			       STAT_FAST_SERVER_FALLBACK_LEARNED;
		// This entry, and the unstamped close's, have no _GENERAL twin: they stand
		// for the straight line's FastPath, which the general path does not count.
		if (general)
			count(STAT_GENERAL_PATH);
	} else if (cheetah && without_timestamp && is_close && cold) {
		if (first_close)
			close_record(&cold->close);
		stat = first_close ? STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE :
				     STAT_FAST_SERVER_NO_TIMESTAMP_DUPLICATE_CLOSE;
		if (general)
			count(STAT_GENERAL_PATH);
	} else if (cheetah && without_timestamp) {
		if (tcp_flags(p->tcp) & TCP_RST)
			stat = general ? STAT_FAST_SERVER_RESET_NO_TIMESTAMP_GENERAL :
					 STAT_FAST_SERVER_RESET_NO_TIMESTAMP;
		else
			stat = general ? STAT_FAST_SERVER_NO_TIMESTAMP_GENERAL :
					 STAT_FAST_SERVER_NO_TIMESTAMP;
	} else if (cheetah) {
		// The cookie takes the place of the MSB; the low half stays. Where the walk
		// found it, as the core's general path writes it: the whole word, at any offset.
		if (walked)
			csum_rewrite_option_u32((__u8 *)tsval, &p->tcp->check, at & 1,
						(__u32)cookie << 16 | (bpf_ntohl(*tsval) & 0xffff));
		else
			csum_replace_high_half((__u16 *)tsval, &p->tcp->check, cookie);
		stat = STAT_FAST_SERVER_COOKIE;
		if (is_close && cold) {
			if (first_close)
				close_record(&cold->close);
			stat = first_close ? STAT_FAST_SERVER_CLOSE : STAT_FAST_SERVER_DUPLICATE_CLOSE;
		}
		if (learns && cold)
			stat = clock_learnt_stat(stat, learns, &cold->learning);
	} else {
		stat = general ? STAT_FAST_SERVER_PLAIN_GENERAL : STAT_FAST_SERVER_PLAIN;
	}
	// server_reply.rs `reply_leaves_as_vip`: with NAT the reply leaves from the VIP's
	// address and port (the client knows no other), not the server's.
	if (nat) {
		__be32 old = csum_set_ipv4_addr(&p->ip->check, &p->ip->saddr, vip_addr);

		csum_tcp_address_changed(&p->tcp->check, old, vip_addr);
		if (p->tcp->source != vip_port)
			csum_set_tcp_port(&p->tcp->check, &p->tcp->source, vip_port);
	}
	__builtin_memcpy(p->eth->h_dest, hop.hop.dmac, ETH_ALEN);
	__builtin_memcpy(p->eth->h_source, hop.hop.smac, ETH_ALEN);
	if (answers && cold && handshake_answer_moves(&cold->answer, id)) {
		move_count(cold->answer.from, id);
		count(STAT_ANSWER_MOVED);
	}
	add_server_traffic(id, plain_ip_len(p), first_close);
	count(stat);
	count_options_walked(walked);
	return send_out(ctx, hop.hop.ifindex);
}

#endif
