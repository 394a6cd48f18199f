// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The in-kernel straight lines, held byte for byte to the core's
// (crates/core/src/lb/fast_path.rs): a client's established segment to a VIP (cookie
// decoded from TSecr, TSecr restored, toward the server; or, in hash mode, `pool[h % n]`)
// and a server's reply (clock checked, cookie written into TSval, NAT undone, toward the
// client). Each either forwards the packet itself, its bytes exactly what the core (plus
// the AF_XDP worker's egress step) would send, or returns LB_HAND_UP, having counted one
// STAT_UP_* reason and changed no byte: userspace then decides, as it always did.
//
// The kernel takes less than the core's straight line, never more: whatever would change
// state (a new connection's pick, a clock that moved, a handshake or close to book) or
// that the maps do not answer (a server without a resolved egress, a FIB miss) goes up.

#ifndef CHEETAH_LIB_FAST_PATH_H
#define CHEETAH_LIB_FAST_PATH_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "cookie.h"
#include "csum.h"
#include "maps.h"
#include "next_hop.h"
#include "parse.h"
#include "publish.h"
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

static __always_inline int hand_up_refused(enum plain_refusal refusal)
{
	return hand_up(refusal == PLAIN_NOT_TCP ? STAT_UP_OTHER : STAT_UP_LAYOUT);
}

static __always_inline struct cookie_layout layout_of(const struct lb_config *config)
{
	struct cookie_layout layout = { .id_bits = config->id_bits, .id_mask = config->id_mask };

	return layout;
}

// The core's `loads.on_packet(server, IP bytes)`, folded into its loads by userspace.
static __always_inline void add_server_traffic(__u32 server, const struct iphdr *ip)
{
	struct server_traffic *traffic = bpf_map_lookup_elem(&server_traffic, &server);

	if (traffic) {
		traffic->packets += 1;
		traffic->bytes += bpf_ntohs(ip->tot_len);
	}
}

// Whether replies are taken from the interface `ifindex` (server_side, maps.h).
static __always_inline int on_server_side(__u32 ifindex)
{
	__u32 slot = ifindex & (SERVER_SIDE_SLOTS - 1);
	__u32 *owner = bpf_map_lookup_elem(&server_side, &slot);

	return owner && *owner == ifindex;
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

// client_path.rs `forward_to_server_via`, plus the egress step the AF_XDP worker does
// after it (source MAC = the egress interface's, egress.rs): the server's MAC, with NAT
// its address and the VIP's backend port.
static __always_inline int forward_to_server(struct xdp_md *ctx, const struct plain_tcp *p,
					     const struct toward_server *to, __u32 stat)
{
	const struct server_info *server = &to->server;

	__builtin_memcpy(p->eth->h_dest, server->dst_mac, ETH_ALEN);
	__builtin_memcpy(p->eth->h_source, server->src_mac, ETH_ALEN);
	if (to->forwarding == LB_FORWARDING_NAT) {
		__be32 old = csum_set_ipv4_addr(&p->ip->check, &p->ip->daddr, server->dip);

		csum_tcp_address_changed(&p->tcp->check, old, server->dip);
		if (to->backend_port != to->vip_port)
			csum_set_tcp_port(&p->tcp->check, &p->tcp->dest, to->backend_port);
	}
	add_server_traffic(to->id, p->ip);
	count(stat);
	return send_out(ctx, server->egress_ifindex);
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
static __always_inline struct vip_info *client_vip(const struct plain_tcp *p)
{
	struct vip_key key = {};

	key.addr = p->ip->daddr;
	key.port = p->tcp->dest;
	key.protocol = IPPROTO_TCP;
	return bpf_map_lookup_elem(&vips, &key);
}

// Why a segment to a VIP address that client_vip did not find goes up: as the core's
// client_fast refuses it (not the plain layout, or no TCP VIP on that port).
static __always_inline int client_not_found(enum plain_refusal refusal)
{
	if (refusal != PLAIN_OK)
		return hand_up_refused(refusal);
	return hand_up(STAT_UP_OTHER);
}

// fast_path.rs `client_fast` for a plain segment `p` to TCP VIP `vip` (client_vip);
// `seq` is what publish_begin said before lb_config and vip were read.
static __always_inline int client_fast(struct xdp_md *ctx, const struct lb_config *config,
				       __u32 seq, const struct plain_tcp *p,
				       const struct vip_info *vip)
{
	struct toward_server to;
	struct server_info *server;
	__u16 restored = 0;
	__u32 id, stat;
	__u64 hash;

	if (config->mode == LB_MODE_CHEETAH) {
		struct cookie_layout layout = layout_of(config);
		__u16 unmasked;

		// A SYN takes the policy; a segment without ACK carries no echo in TSecr (RFC
		// 7323), so userspace routes it like one without timestamps.
		if ((tcp_flags(p->tcp) & (TCP_SYN | TCP_ACK)) != TCP_ACK)
			return hand_up(STAT_UP_NEW_CONNECTION);
		if (!plain_has_nop_nop_ts(p))
			return hand_up(STAT_UP_LAYOUT);
		// The VIP's side of the id was hashed by userspace (the packet's destination is
		// the VIP's address and port: that is how it was found).
		hash = siphash_finish(vip->hash_prefix, p->ip->saddr, p->tcp->source);
		// The cookie is TSecr's high half.
		unmasked = cookie_unmask(layout, bpf_ntohs(*(__be16 *)&p->ts->tsecr), hash);
		id = cookie_server(layout, unmasked);
		server = bpf_map_lookup_elem(&servers, &id);
		if (!server || !(server->flags & SERVER_FORWARDS))
			return hand_up(STAT_UP_COOKIE);
		if (!cookie_restore(&msb_restores, unmasked, &restored))
			return hand_up(STAT_UP_COOKIE);
		if (!(server->flags & SERVER_EGRESS))
			return hand_up(STAT_UP_NEXT_HOP);
		stat = STAT_FAST_CLIENT_COOKIE;
	} else if (config->mode == LB_MODE_HASH) {
		// The baseline: this same path with `pool[h % n]` for the cookie stage, for every
		// segment (SYN too), as the core's.
		__u32 pool_len = vip->pool_len;
		__u64 slot;

		if (pool_len == 0 || pool_len > MAX_HASH_POOL)
			return hand_up(STAT_UP_OTHER);
		hash = siphash_finish(vip->hash_prefix, p->ip->saddr, p->tcp->source);
		slot = hash % pool_len;
		// The verifier cannot bound a remainder; the mask gives it the array's bound,
		// and the empty asm keeps clang from dropping the mask it knows is a no-op->
		asm volatile("" : "+r"(slot));
		id = vip->pool[slot & (MAX_HASH_POOL - 1)];
		server = bpf_map_lookup_elem(&servers, &id);
		if (!server || !(server->flags & SERVER_EGRESS))
			return hand_up(STAT_UP_NEXT_HOP);
		stat = STAT_FAST_CLIENT_PICK;
	} else {
		// Maglev's table is not in a map in this stage.
		return hand_up(STAT_UP_OTHER);
	}
	toward_server_of(&to, config, vip, server, id);
	if (!publish_unchanged(config, seq))
		return hand_up(STAT_UP_PUBLISHING);
	if (stat == STAT_FAST_CLIENT_COOKIE)
		// Only the MSB changes: the cookie becomes the server's own MSB, which the table
		// keeps in network byte order.
		csum_replace_high_half_in_network_order((__u16 *)&p->ts->tsecr, &p->tcp->check,
							restored);
	return forward_to_server(ctx, p, &to, stat);
}

// Who sent a reply and for which VIP: l2 by the server's MAC and the VIP's address and
// port (its source), NAT by its backends entry. NULL: not a server's reply the maps know.
static __always_inline struct vip_info *reply_sender(const struct plain_tcp *p,
						     const struct lb_config *config,
						     const struct backend_info *backend, __u32 *id)
{
	if (config->forwarding == LB_FORWARDING_NAT) {
		__u32 index;

		if (!backend)
			return NULL;
		*id = backend->server;
		index = backend->vip_index;
		return bpf_map_lookup_elem(&vips_by_index, &index);
	} else {
		struct mac_key mac = {};
		struct vip_key key = {};
		__u32 *server;

		__builtin_memcpy(mac.mac, p->eth->h_source, ETH_ALEN);
		server = bpf_map_lookup_elem(&server_macs, &mac);
		if (!server)
			return NULL;
		*id = *server;
		key.addr = p->ip->saddr;
		key.port = p->tcp->source;
		key.protocol = IPPROTO_TCP;
		return bpf_map_lookup_elem(&vips, &key);
	}
}

// fast_path.rs `reply_fast` for a server's reply (steering said so: from a VIP address,
// or from a NAT backend to a client); `backend` is its backends entry with NAT. `p` is
// the frame as parse_plain_tcp left it, `refusal` what it said (lb_process parsed it);
// `seq` what publish_begin said before lb_config was read.
static __always_inline int reply_fast(struct xdp_md *ctx, const struct lb_config *config,
				      __u32 seq, const struct backend_info *backend,
				      const struct plain_tcp *p, enum plain_refusal refusal)
{
	__u32 ingress = ctx->ingress_ifindex;
	struct next_hop hop;
	struct server_info *server;
	struct vip_info *vip;
	__be32 vip_addr;
	__be16 vip_port;
	__u16 cookie = 0;
	__u32 id = 0, stat;
	int cheetah = config->mode == LB_MODE_CHEETAH;
	int nat = config->forwarding == LB_FORWARDING_NAT;

	// Only the servers' side carries replies (sides.rs): what only claims to be one is
	// for userspace to drop.
	if (!on_server_side(ingress))
		return hand_up(STAT_UP_OTHER);
	if (refusal != PLAIN_OK)
		return hand_up_refused(refusal);
	vip = reply_sender(p, config, backend, &id);
	if (!vip)
		return hand_up(STAT_UP_OTHER);
	server = bpf_map_lookup_elem(&servers, &id);
	if (!server || !(server->flags & SERVER_FORWARDS))
		return hand_up(STAT_UP_OTHER);

	if (cheetah) {
		struct cookie_layout layout = layout_of(config);
		struct msb_seen_words *seen;
		__u32 zero = 0;
		__u16 msb;
		__u64 hash;

		if (tcp_flags(p->tcp) & (TCP_SYN | TCP_FIN | TCP_RST))
			return hand_up(STAT_UP_HANDSHAKE_OR_CLOSE);
		if (!plain_has_nop_nop_ts(p))
			return hand_up(STAT_UP_LAYOUT);
		msb = bpf_ntohl(p->ts->tsval) >> 16;
		seen = bpf_map_lookup_elem(&msb_seen, &zero);
		if (!seen || !cookie_clock_unchanged(seen->word[id & (SERVER_ID_SPACE - 1)], msb))
			return hand_up(STAT_UP_CLOCK);
		// The connection's hash: its client is the reply's destination.
		hash = siphash_finish(vip->hash_prefix, p->ip->daddr, p->tcp->dest);
		cookie = cookie_encode(layout, id, hash, msb);
	}

	// Before any byte changes: no next hop (map and FIB both) hands the packet up as it
	// came, with the metadata steering writes for the worker's neighbour lookup.
	if (!next_hop_toward_client(ctx, p->ip, &hop))
		return hand_up(STAT_UP_NEXT_HOP);
	vip_addr = vip->addr;
	vip_port = vip->port;
	if (!publish_unchanged(config, seq))
		return hand_up(STAT_UP_PUBLISHING);

	if (cheetah) {
		// The cookie takes the place of the MSB; the low half stays.
		csum_replace_high_half((__u16 *)&p->ts->tsval, &p->tcp->check, cookie);
		stat = STAT_FAST_SERVER_COOKIE;
	} else {
		stat = STAT_FAST_SERVER_PLAIN;
	}
	// server_reply.rs `reply_leaves_as_vip`: with NAT the reply leaves from the VIP's
	// address and port (the client knows no other), not the server's.
	if (nat) {
		__be32 old = csum_set_ipv4_addr(&p->ip->check, &p->ip->saddr, vip_addr);

		csum_tcp_address_changed(&p->tcp->check, old, vip_addr);
		if (p->tcp->source != vip_port)
			csum_set_tcp_port(&p->tcp->check, &p->tcp->source, vip_port);
	}
	__builtin_memcpy(p->eth->h_dest, hop.dmac, ETH_ALEN);
	__builtin_memcpy(p->eth->h_source, hop.smac, ETH_ALEN);
	add_server_traffic(id, p->ip);
	count(stat);
	return send_out(ctx, hop.ifindex);
}

#endif
