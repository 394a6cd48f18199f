// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Who sent a server's reply (fast_path.rs `reply_fast`'s sender: the server and the VIP it
// answers for), found two ways that give the same answer:
//
// - reply_known: one reply_senders read, before steering. The publisher keeps there every
//   forwarding server's (l2: MAC and VIP address and port of each VIP it serves; nat: its
//   backends), each at the slot its key hashes to, so a hit is a reply steering would call
//   META_FROM_SERVER and the old way's maps would find, once the destination is checked
//   as steering checks it.
// - reply_by_steering: what the program always did, for what the map does not know (a
//   server answering for a VIP it does not serve, a removed server, a reply on the
//   clients' side, an unusual layout, a sender whose slot another took): steering classified it, then server_macs and vips (l2) or its
//   backends entry and vips_by_index (nat), then servers. Its hand-ups and the metadata
//   steering writes stay exactly as before.

#ifndef CHEETAH_LIB_REPLY_SENDER_H
#define CHEETAH_LIB_REPLY_SENDER_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "fast_path.h"
#include "maps.h"
#include "parse.h"
#include "publish.h"
#include "steer.h"
#include "vip_addr_filter.h"

// The slot of `key` (dataplane/reply_senders.rs computes the same): its three words as
// they lie in memory.
static __always_inline __u32 reply_slot_of(const struct reply_key *key)
{
	const __u32 *word = (const __u32 *)key;
	__u64 x = ((__u64)word[1] << 32 | word[0]) * REPLY_SLOT_MULTIPLIER;

	return ((x ^ word[2]) * REPLY_SLOT_MULTIPLIER) >> (64 - REPLY_SLOT_BITS);
}

// The sender reply_senders holds for the reply `p` (l2: by its source MAC too), or NULL.
static __always_inline const struct reply_sender *reply_lookup(const struct lb_config *config,
								const struct plain_tcp *p)
{
	struct reply_key key = {};
	const struct reply_slot *at;
	const __u32 *want = (const __u32 *)&key;
	const __u32 *have;
	__u32 slot;

	key.addr = p->ip->saddr;
	key.port = p->tcp->source;
	if (config->forwarding != LB_FORWARDING_NAT)
		__builtin_memcpy(key.mac, p->eth->h_source, ETH_ALEN);
	slot = latched_index(config->copy, reply_slot_of(&key), REPLY_SLOTS);
	at = bpf_map_lookup_elem(&reply_senders, &slot);
	if (!at || !at->used)
		return NULL;
	have = (const __u32 *)&at->key;
	if (have[0] != want[0] || have[1] != want[1] || have[2] != want[2])
		return NULL;
	return &at->sender;
}

// The sender of plain segment `p` (of a layout plain_tcp_set takes) if reply_senders knows it
// and steering would take it as a server's reply the kernel may forward; NULL: find it the
// old way (nothing was counted).
static __always_inline const struct reply_sender *reply_known(struct xdp_md *ctx,
							      const struct lb_config *config,
							      const struct plain_tcp *p)
{
	const struct reply_sender *sender;
	struct vip_addr_key client = { .addr = p->ip->daddr, .copy = config->copy };

	// Only the servers' side carries replies (sides.rs).
	if (!on_server_side(config->copy, ctx->ingress_ifindex))
		return NULL;
	sender = reply_lookup(config, p);
	if (!sender)
		return NULL;
	// Steering's tests of the destination: a segment to a VIP's address is a client's
	// (the core drops what only claims to be a reply), and a NAT backend's segment to
	// this host answers the host's health probe (steer.h steer_owner).
	if (may_be_vip_addr(config, client.addr) && bpf_map_lookup_elem(&vip_addrs, &client))
		return NULL;
	if (config->forwarding == LB_FORWARDING_NAT &&
	    bpf_map_lookup_elem(&host_addrs, &client.addr))
		return NULL;
	return sender;
}

// The id of the server whose MAC `src` is (l2), or NULL: steering's test of a segment
// from a VIP address, the core's `server_by_mac`.
static __always_inline __u32 *server_by_mac(const struct lb_config *config, const __u8 *src)
{
	struct mac_key mac = {};

	__builtin_memcpy(mac.mac, src, ETH_ALEN);
	mac.copy = config->copy;
	return bpf_map_lookup_elem(&server_macs, &mac);
}

// A segment from a VIP address (l2) that steering called a server's reply but whose
// layout the kernel does not take (parse_plain_tcp's PLAIN_LAYOUT: a fragment, or a TCP
// header the core's parse refuses), dropped as the core drops it (worker.rs `classify`,
// then `server_tcp` for a known server's VIP port, else `classify_rest`): from a MAC no
// server has (`unknown_server_source`), a fragment (`unsupported_fragment`), from a known
// server's VIP port on the clients' side (`reply_from_client_side`) or of a removed
// server (`server_removed`), else under its TCP header's fault. LB_HAND_UP for anything
// else (a well-formed TCP header, a VIP port the kernel cannot tell), counted as `up`.
// A forged flood of garbled "replies" so costs the kernel a few lookups a packet.
static __always_inline int garbled_reply_l2(struct xdp_md *ctx, const struct lb_config *config,
					    __u32 seq, int client_side, __u32 up)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct server_info *server;
	enum tcp_fault fault;
	__be16 *src_port;
	__u32 *by_mac;

	if (!ipv4_checked(ctx) || (void *)(ip + 1) > data_end || ip->protocol != IPPROTO_TCP)
		return hand_up(up);
	by_mac = server_by_mac(config, eth->h_source);
	if (!by_mac)
		return drop_by_tables(seq, STAT_DROP_UNKNOWN_SERVER_SOURCE);
	if (ip->frag_off & bpf_htons(0x3fff))
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_FRAGMENT);
	fault = tcp_header_fault(ctx);
	if (fault == TCP_CHECKED)
		return hand_up(up);
	// The ports, if the segment holds them (ipv4_checked: within the frame; the bound is
	// for the verifier): the core asks for the sender's VIP first.
	src_port = (void *)ip + ip->ihl * 4;
	if (bpf_ntohs(ip->tot_len) >= ip->ihl * 4 + 4 && (void *)(src_port + 2) <= data_end) {
		if (tcp_vip_at(config->copy, ip->saddr, *src_port)) {
			if (client_side)
				return drop_by_tables(seq, STAT_DROP_REPLY_FROM_CLIENT_SIDE);
			server = server_at(config->copy, *by_mac);
			if (!server)
				return hand_up(up);
			if (!(server->flags & SERVER_FORWARDS))
				return drop_by_tables(seq, STAT_DROP_SERVER_REMOVED_GENERAL);
		} else if (!(config->flags & LB_EVERY_VIP)) {
			return hand_up(up);
		}
	}
	return drop_tcp_fault(seq, fault);
}

// A packet from a VIP address (l2) that is no TCP segment: the core's `classify_rest`
// drops it from a MAC no server has (`unknown_server_source`: a forged source, on either
// side) or as a fragment (`unsupported_fragment`), and forwards anything else to the client
// as it came (a server's ICMP error, say), counting it to the server. The action, or
// LB_HAND_UP with its reason counted (no next hop, a publication; `other` for a header the
// core would refuse first, which the caller's drop_bad_ipv4_header leaves none of), the
// frame unchanged.
static __always_inline int not_tcp_from_vip_l2(struct xdp_md *ctx, const struct lb_config *config,
					       __u32 seq, __u32 ip_options_lifted)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct next_hop_found hop;
	__u32 *by_mac, server, len;

	if (!ipv4_checked(ctx) || (void *)(ip + 1) > data_end || ip->protocol == IPPROTO_TCP)
		return hand_up(STAT_UP_OTHER);
	by_mac = server_by_mac(config, eth->h_source);
	if (!by_mac)
		return drop_by_tables(seq, STAT_DROP_UNKNOWN_SERVER_SOURCE);
	if (ip->frag_off & bpf_htons(0x3fff))
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_FRAGMENT);
	server = *by_mac;
	len = bpf_ntohs(ip->tot_len) + ip_options_lifted;
	if (!next_hop_toward_client(ctx, ip, len, config->copy, seq, &hop))
		return hand_up(STAT_UP_NEXT_HOP);
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	next_hop_remember(&hop, ip->daddr, seq);
	__builtin_memcpy(eth->h_dest, hop.hop.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, hop.hop.smac, ETH_ALEN);
	add_server_traffic(server, len, 0);
	count(STAT_FAST_SERVER_NOT_TCP);
	return send_out(ctx, hop.hop.ifindex);
}

// A pass decided on the published tables read under `seq`, as drop_by_tables drops.
static __always_inline int pass_by_tables(__u32 seq)
{
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	return pass();
}

// A NAT backend's segment that the core's classify leaves to `classify_rest` (no current
// backend at its (DIP, port), or a fragment or a segment too short for its ports from
// one): dropped as `server_removed` if a removed server had its DIP (the core's
// `removed_server_at`, which the publisher marks on the entry), else passed to the host
// as the core passes it, on either side. The host's stack drops it too (the LB's
// interfaces do not forward) but counts it as its own; the AF_XDP path cannot pass a
// frame a socket took, so its worker drops what the core passes.
static __always_inline int not_a_reply_nat(__u32 seq, const struct backend_info *backend)
{
	if (backend->flags & BACKEND_DIP_OF_REMOVED)
		return drop_by_tables(seq, STAT_DROP_SERVER_REMOVED_GENERAL);
	return pass_by_tables(seq);
}

// A NAT segment from a VIP address (steering asks vip_addrs before backends, so it found
// no backend): replies come from backends with NAT, and no server that forwards may have a
// VIP's address (config.rs `dip_is_a_vip_address`), so the source is forged. Passed to the
// host as the core passes it, or dropped as `server_removed` where a removed server had
// the address; LB_HAND_UP, counted as `up`, if the address's entry is gone (a publication
// under way).
static __always_inline int from_vip_addr_nat(struct xdp_md *ctx, __u32 copy, __u32 seq,
					     __u32 up)
{
	struct iphdr *ip = (void *)(long)ctx->data + sizeof(struct ethhdr);
	struct vip_addr_key key = { .copy = copy };
	__u32 *flags;

	if (!ipv4_checked(ctx) || (void *)(ip + 1) > (void *)(long)ctx->data_end)
		return hand_up(up);
	key.addr = ip->saddr;
	flags = bpf_map_lookup_elem(&vip_addrs, &key);
	if (!flags)
		return hand_up(up);
	if (*flags & VIP_ADDR_DIP_OF_REMOVED)
		return drop_by_tables(seq, STAT_DROP_SERVER_REMOVED_GENERAL);
	return pass_by_tables(seq);
}

// The same for a NAT backend's segment (steering found `backend`, its (DIP, port) entry),
// dropped or passed as the core does (worker.rs `classify`, `server_tcp`,
// `classify_rest`): of a (DIP, port) no current backend has, or a fragment or a segment
// shorter than its ports, not_a_reply_nat; else, a whole segment of 4 bytes or more from
// a current backend's: on the clients' side (`reply_from_client_side`), of a server that
// no longer forwards (`server_removed`), else under its TCP header's fault. LB_HAND_UP,
// counted as `up`, for a server the entry names but the servers map does not.
static __always_inline int garbled_reply_nat(struct xdp_md *ctx, const struct lb_config *config,
					     __u32 seq, const struct backend_info *backend,
					     int client_side, __u32 up)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = (void *)(long)ctx->data + sizeof(struct ethhdr);
	struct server_info *server;
	enum tcp_fault fault;

	if (!ipv4_checked(ctx) || (void *)(ip + 1) > data_end || ip->protocol != IPPROTO_TCP)
		return hand_up(up);
	if (backend->vip_index == BACKEND_NO_VIP ||
	    (ip->frag_off & bpf_htons(0x3fff)) || bpf_ntohs(ip->tot_len) < ip->ihl * 4 + 4)
		return not_a_reply_nat(seq, backend);
	server = server_at(config->copy, backend->server);
	if (!server)
		return hand_up(up);
	if (client_side)
		return drop_by_tables(seq, STAT_DROP_REPLY_FROM_CLIENT_SIDE);
	if (!(server->flags & SERVER_FORWARDS))
		return drop_by_tables(seq, STAT_DROP_SERVER_REMOVED_GENERAL);
	fault = tcp_header_fault(ctx);
	if (fault == TCP_CHECKED)
		return hand_up(up);
	return drop_tcp_fault(seq, fault);
}

// The sender of a segment steering called a server's reply (`backend`: its backends entry
// with NAT; counted as STAT_REPLY_BY_STEERING), copied into `found`; NULL when the kernel
// leaves it to userspace, having counted why (not the plain layout, or no forwarding
// server), or drops or forwards it as the core does (*dropped: the action), having counted
// that (l2, a packet from a VIP address that is no TCP segment: not_tcp_from_vip_l2):
// - a sender the core finds, on the clients' side (`reply_from_client_side`);
// - l2: from a MAC no server has (`unknown_server_source`, on either side: the core asks
//   before the side), from a port of a VIP address no VIP is on (`vip_port_unknown`), or
//   from a server that no longer forwards (`server_removed`);
// - nat: from a (DIP, port) no current backend has, or from a VIP address, dropped where
//   a removed server had the address (`server_removed`), else passed to the host as the
//   core passes it (not_a_reply_nat, from_vip_addr_nat); anything but TCP from a VIP
//   address is passed too.
static __always_inline const struct reply_sender *
reply_by_steering(struct xdp_md *ctx, const struct lb_config *config, __u32 seq,
		  const struct backend_info *backend, const struct plain_tcp *p,
		  enum plain_refusal refusal, struct reply_sender *found, int *dropped)
{
	int l2 = config->forwarding != LB_FORWARDING_NAT;
	struct server_info *server;
	struct vip_info *vip;
	__u32 *by_mac = NULL;
	int client_side;
	__u32 id;

	count(STAT_REPLY_BY_STEERING);
	if (l2 && plain_tcp_set(refusal)) {
		by_mac = server_by_mac(config, p->eth->h_source);
		if (!by_mac) {
			*dropped = drop_by_tables(seq, STAT_DROP_UNKNOWN_SERVER_SOURCE);
			return NULL;
		}
	}
	// Only the servers' side carries replies (sides.rs).
	client_side = !on_server_side(config->copy, ctx->ingress_ifindex);
	if (!plain_tcp_set(refusal)) {
		if (refusal == PLAIN_NOT_TCP && l2) {
			*dropped = not_tcp_from_vip_l2(ctx, config, seq, p->ip_options_lifted);
			return NULL;
		}
		// With NAT, replies come from backends, never from a VIP address: a packet
		// from one that is no TCP segment (a forged source) is the host's, as the core
		// passes it (`classify_rest`), fragment or not. (Its IP header is sound:
		// lb_decide dropped a garbled one.)
		if (refusal == PLAIN_NOT_TCP) {
			*dropped = pass_by_tables(seq);
			return NULL;
		}
		if (refusal == PLAIN_LAYOUT) {
			// Each counts a hand-up itself (a publication that moved, or this).
			__u32 up = client_side ? STAT_UP_OTHER : STAT_UP_LAYOUT;

			if (l2)
				*dropped = garbled_reply_l2(ctx, config, seq, client_side, up);
			else if (backend)
				*dropped = garbled_reply_nat(ctx, config, seq, backend, client_side,
							     up);
			else
				*dropped = from_vip_addr_nat(ctx, config->copy, seq, up);
			return NULL;
		}
		if (client_side)
			hand_up(STAT_UP_OTHER);
		else
			hand_up_refused(refusal);
		return NULL;
	}
	if (!l2) {
		__u32 index;

		if (!backend) {
			*dropped = from_vip_addr_nat(ctx, config->copy, seq, STAT_UP_OTHER);
			return NULL;
		}
		id = backend->server;
		// No current backend at this (DIP, port): the core's drop of a removed server's
		// late reply (`removed_server_at`, by its DIP, on either side), or its pass.
		// Its general path: no `fast_path` before it.
		if (backend->vip_index == BACKEND_NO_VIP) {
			*dropped = not_a_reply_nat(seq, backend);
			return NULL;
		}
		if (client_side) {
			*dropped = drop_by_tables(seq, STAT_DROP_REPLY_FROM_CLIENT_SIDE);
			return NULL;
		}
		index = latched_index(config->copy, backend->vip_index, MAX_VIPS);
		vip = bpf_map_lookup_elem(&vips_by_index, &index);
	} else {
		if (!by_mac) { // (looked up above for this layout: for the verifier)
			hand_up(STAT_UP_OTHER);
			return NULL;
		}
		id = *by_mac;
		vip = tcp_vip_at(config->copy, p->ip->saddr, p->tcp->source);
		// A known server's segment from its VIP address, but from a port no VIP is on
		// (on either side: the core asks before it checks the side).
		if (!vip && (config->flags & LB_EVERY_VIP)) {
			*dropped = drop_by_tables(seq, STAT_DROP_VIP_PORT_UNKNOWN);
			return NULL;
		}
		// A server's reply that arrived where clients are: forged, dropped before
		// anything is learnt from it.
		if (vip && client_side) {
			*dropped = drop_by_tables(seq, STAT_DROP_REPLY_FROM_CLIENT_SIDE);
			return NULL;
		}
	}
	if (!vip || client_side) {
		hand_up(STAT_UP_OTHER);
		return NULL;
	}
	server = server_at(config->copy, id);
	if (l2 && server && !(server->flags & SERVER_FORWARDS)) {
		*dropped = drop_by_tables(seq, refusal == PLAIN_OK ? STAT_DROP_SERVER_REMOVED :
								     STAT_DROP_SERVER_REMOVED_GENERAL);
		return NULL;
	}
	if (!server || !(server->flags & SERVER_FORWARDS)) {
		hand_up(STAT_UP_OTHER);
		return NULL;
	}
	__builtin_memcpy(found->hash_prefix, vip->hash_prefix, sizeof(found->hash_prefix));
	found->vip_addr = vip->addr;
	found->vip_port = vip->port;
	found->server = id;
	return found;
}

#endif
