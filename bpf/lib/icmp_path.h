// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// ICMP errors toward a VIP routed by the cookie they quote, byte for byte
// crates/core/src/lb/icmp_path.rs (`client_icmp` and `rewrite_for_server`): a router
// between the LB and a client (e.g. "fragmentation needed") quotes the VIP's segment to
// the client, whose TSval carries the cookie of the server that sent it. The error goes to
// that server, the quoted TSval restored to what the server sent, and with NAT the outer
// destination and the quoted source translated back to the server's address and port.
// Every checksum the core updates (outer IP, ICMP, quoted IP, quoted TCP) is updated the
// same way, in the same order, so even the two encodings of zero come out as the core's.
//
// The kernel takes the straight case only: an IPv4 frame (tags and IP options lifted:
// vlan.h, ip_options.h) carrying an error (destination unreachable, time exceeded,
// parameter problem) that quotes a VIP's TCP segment (its own IP options, if any, skipped
// by the quoted IHL) with a whole TCP header whose options hold a timestamp (NOP NOP TS
// first, or wherever the core's walk finds it: parse.h tcp_timestamp_walk), in cheetah
// mode, whose cookie names a forwarding server (its clock unknown, the quote goes
// unrestored, as the core sends it; an echo beyond the idle limit is counted); and in
// hash and maglev mode, any such error (the least quote will do), to `pool[h % n]` or the
// VIP's Maglev table's pick of the quoted connection as the core picks it (nothing in the
// quote changes but NAT's translation). A cookie that names an id no server has or a
// removed server is dropped, as the core drops it; so is, before any cookie, what the
// core's `Embedded::parse` refuses (a message shorter than its header, a ping or any other
// type but an error, a quote shorter than an IPv4 header and 8 bytes, or of no TCP segment
// from that VIP address) and a quote from a port no VIP is on (LB_EVERY_VIP). In cheetah
// mode a quote without a cookie (8 bytes of TCP only, options without a timestamp, or
// malformed ones: a client without timestamps) goes to the forwarding server the fallback
// table remembers for the quoted connection, looked at without marking it used, as the
// core's `peek`. The rest goes up, unchanged: such a quote of a connection the table does
// not know (or of a server that no longer forwards) as STAT_UP_ICMP, for userspace to copy
// it to every server of the VIP (rate-limited); the others by the usual reasons.

#ifndef CHEETAH_LIB_ICMP_PATH_H
#define CHEETAH_LIB_ICMP_PATH_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "cookie.h"
#include "csum.h"
#include "fallback_table.h"
#include "fast_path.h"
#include "maglev.h"
#include "maps.h"
#include "parse.h"
#include "pool.h"
#include "publish.h"
#include "siphash.h"

#define ICMP_HEADER_LEN 8
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12
// What the kernel looks into after the quoted IP header (options included): the first 8
// bytes of TCP, the least RFC 792 promises; with the whole TCP header and NOP NOP TS, the
// cookie.
#define ICMP_QUOTED_TCP_MIN 8
// A quote holding the quoted TCP checksum (bytes 16-17 of its header), which NAT updates.
#define ICMP_QUOTED_TCP_WITH_CHECK 18
// The longest IPv4 header (IHL 15): the quoted TCP header lies at most this far in.
#define IPV4_HEADER_MAX 60

// The ICMP header's checksum word (`Embedded::write` keeps it as right or wrong as it was).
struct icmp_error {
	__u8 type;
	__u8 code;
	__u16 check;
	__u32 rest;
};

// `Embedded::write` for a 16-bit field at an even offset from the ICMP header: `*field`
// becomes `new` (network order) and the ICMP checksum follows.
static __always_inline void icmp_write_u16(struct icmp_error *icmp, __u16 *field, __u16 new)
{
	__u16 old = *field;

	*field = new;
	icmp->check = bpf_htons(csum_update_u16(bpf_ntohs(icmp->check), bpf_ntohs(old),
						bpf_ntohs(new)));
}

// The same for a 32-bit field.
static __always_inline void icmp_write_u32(struct icmp_error *icmp, __be32 *field, __be32 new)
{
	__be32 old = *field;

	*field = new;
	icmp->check = bpf_htons(csum_update_u32(bpf_ntohs(icmp->check), bpf_ntohl(old),
						bpf_ntohl(new)));
}

// The same for a 32-bit word at any offset (`odd_offset`: its parity from the ICMP header)
// in a quoted TCP option: byte copies, the change byte-swapped into the checksum at an
// odd offset (checksum.rs `update`).
static __always_inline void icmp_write_option_u32(struct icmp_error *icmp, __u8 *field,
						  int odd_offset, __u32 old, __u32 new)
{
	__be32 new_be = bpf_htonl(new);

	__builtin_memcpy(field, &new_be, sizeof(new_be));
	icmp->check = bpf_htons(csum_update_u32_at(bpf_ntohs(icmp->check), odd_offset, old, new));
}

// `Embedded::update_tcp_checksum` for a changed 32-bit field (`old`, `new` in host order)
// of the quoted TCP header, whose checksum the kernel's quote always holds.
static __always_inline void icmp_quoted_tcp_u32_changed(struct icmp_error *icmp,
							  struct tcphdr *tcp, __u32 old, __u32 new)
{
	icmp_write_u16(icmp, &tcp->check,
		       bpf_htons(csum_update_u32(bpf_ntohs(tcp->check), old, new)));
}

// A baseline's pick for the quoted connection (`baseline_pick`, as client_fast's: hash
// mode's `pool[h % n]`, maglev mode's table): its server id, or -1 when the pool or table
// is not in the kernel.
static __always_inline long icmp_baseline_pick(const struct lb_config *config,
					       const struct vip_info *vip, __be32 client,
					       __be16 client_port)
{
	__u64 hash = siphash_finish(vip->hash_prefix, client, client_port);
	const struct vip_big_pool *big;
	__u32 id;

	if (config->mode == LB_MODE_MAGLEV)
		return maglev_lookup(config, vip->index, hash, &id) ? id : -1;
	if (!vip_pool_open(config->copy, vip, &big))
		return -1;
	return vip_pool_member(vip, big, hash % vip->pool_len);
}

// An ICMP error without a cookie that no server is remembered for: the core copies it to
// every server of the VIP (userspace does) or, with none in the pool, drops it.
static __always_inline int icmp_to_all(__u32 seq, const struct vip_info *vip)
{
	if (vip->policy == KERNEL_POLICY_EMPTY)
		return drop_by_tables(seq, STAT_DROP_NO_SERVER_AVAILABLE);
	return hand_up(STAT_UP_ICMP);
}

// `rewrite_for_server` and the send, for an error whose server (`target`) is decided and
// whose quote's cookie, if any, is restored: with NAT, the outer destination, the quoted
// source (and the quoted IP header checksum that covers it) and the quoted source port
// become the server's, the quoted TCP checksum following when the quote holds it
// (`quote_len`, past the quoted IP header's `quoted_ip_len`: `Embedded::has_tcp_checksum`);
// then the MACs toward it. Counted under `stat`.
static __always_inline int icmp_to_server(struct xdp_md *ctx, struct ethhdr *eth,
					  struct iphdr *ip, struct icmp_error *icmp,
					  struct iphdr *quoted_ip, struct tcphdr *quoted_tcp,
					  __u32 quote_len, __u32 quoted_ip_len,
					  const struct server_info *target,
					  int nat, __be16 vip_port, __be16 backend_port, __u32 stat)
{
	void *data_end = (void *)(long)ctx->data_end;

	if (nat) {
		__be32 dip = target->dip;
		__u32 old_src = bpf_ntohl(quoted_ip->saddr);
		// The quote lies within the frame (icmp_fast checked the IP total length): the
		// bound beside each use is for the verifier.
		int check_quoted = quote_len >= quoted_ip_len + ICMP_QUOTED_TCP_WITH_CHECK;

		csum_set_ipv4_addr(&ip->check, &ip->daddr, dip);
		icmp_write_u32(icmp, &quoted_ip->saddr, dip);
		icmp_write_u16(icmp, &quoted_ip->check,
			       bpf_htons(csum_update_u32(bpf_ntohs(quoted_ip->check), old_src,
							 bpf_ntohl(dip))));
		if (check_quoted && (void *)&quoted_tcp->urg_ptr <= data_end)
			icmp_quoted_tcp_u32_changed(icmp, quoted_tcp, old_src, bpf_ntohl(dip));
		if (backend_port != vip_port) {
			icmp_write_u16(icmp, &quoted_tcp->source, backend_port);
			if (check_quoted && (void *)&quoted_tcp->urg_ptr <= data_end)
				icmp_write_u16(icmp, &quoted_tcp->check,
					       bpf_htons(csum_update_u16(
						       bpf_ntohs(quoted_tcp->check),
						       bpf_ntohs(vip_port), bpf_ntohs(backend_port))));
		}
	}
	__builtin_memcpy(eth->h_dest, target->dst_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, target->src_mac, ETH_ALEN);
	count(stat);
	return send_out(ctx, target->egress_ifindex);
}

// An error whose server (`server`) is decided and whose quote stays as it came (a
// baseline's pick, the fallback table's): the publication checked, then icmp_to_server.
static __always_inline int icmp_forward_unrestored(struct xdp_md *ctx, __u32 seq,
						   struct ethhdr *eth, struct iphdr *ip,
						   struct icmp_error *icmp, struct iphdr *quoted_ip,
						   struct tcphdr *quoted_tcp, __u32 quote_len,
						   __u32 quoted_ip_len,
						   const struct server_info *server,
						   const struct vip_info *vip, int nat, __u32 stat)
{
	struct server_info target = *server;
	__be16 vip_port = vip->port, backend_port = vip->backend_port;

	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	return icmp_to_server(ctx, eth, ip, icmp, quoted_ip, quoted_tcp, quote_len, quoted_ip_len,
			      &target, nat, vip_port, backend_port, stat);
}

// lb/icmp_path.rs `client_icmp` for a packet to a VIP address that is not TCP (steering's
// META_TO_VIP): forwards an ICMP error to the server its quoted cookie names (or, in hash
// mode, the pool's pick), or hands the packet up having counted why.
static __always_inline int icmp_fast(struct xdp_md *ctx, const struct lb_config *config,
				     __u32 seq)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct icmp_error *icmp = (void *)(ip + 1);
	struct iphdr *quoted_ip = (void *)icmp + ICMP_HEADER_LEN;
	struct tcphdr *quoted_tcp;
	struct nop_nop_ts *quoted_ts;
	struct cookie_layout layout = layout_of(config);
	struct server_info *server, target;
	struct fallback_hit hit = {};
	struct vip_info *vip;
	__be16 vip_port, backend_port;
	int nat, at = 0, restore;
	__u8 *option = NULL, *tsval;
	__be32 tsval_be;
	__u32 total_len, quote_len, quoted_ip_len, id, old_tsval, new_tsval, drop;
	__u16 restored = 0;
	__u64 hash;

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return hand_up(STAT_UP_LAYOUT);
	if (ip->protocol != IPPROTO_ICMP)
		return hand_up(STAT_UP_OTHER);
	total_len = bpf_ntohs(ip->tot_len);
	// No IP options (lifted) and no fragment (dropped before), the IP packet within the
	// frame (drop_bad_ipv4_header dropped it otherwise): what follows reads only bytes
	// within the total length, each bound below being the verifier's.
	if (*(__u8 *)ip != 0x45 || ip->frag_off & bpf_htons(0x3fff) ||
	    total_len < sizeof(struct iphdr) || data + sizeof(struct ethhdr) + total_len > data_end)
		return hand_up(STAT_UP_LAYOUT);
	// The core's `Embedded::parse`, in its order: an ICMP header, an error type, a quote of
	// an IPv4 header and 8 bytes of what it carries, and that a TCP segment.
	if (total_len < sizeof(struct iphdr) + ICMP_HEADER_LEN)
		return drop_by_tables(seq, STAT_DROP_TRUNCATED_ICMP);
	if ((void *)icmp + ICMP_HEADER_LEN > data_end)
		return hand_up(STAT_UP_LAYOUT);
	if (icmp->type != ICMP_DEST_UNREACH && icmp->type != ICMP_TIME_EXCEEDED &&
	    icmp->type != ICMP_PARAMETERPROB)
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_ICMP_TYPE);
	quote_len = total_len - sizeof(struct iphdr) - ICMP_HEADER_LEN;
	if (quote_len < sizeof(struct iphdr))
		return drop_by_tables(seq, STAT_DROP_TRUNCATED_ICMP);
	if ((void *)(quoted_ip + 1) > data_end)
		return hand_up(STAT_UP_LAYOUT);
	if (quoted_ip->version != 4 || quoted_ip->ihl < 5 || quote_len < quoted_ip->ihl * 4 + 8)
		return drop_by_tables(seq, STAT_DROP_TRUNCATED_ICMP);
	if (quoted_ip->protocol != IPPROTO_TCP)
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_ICMP_TYPE);
	// The quoted TCP header follows the quoted IP header and its options, if any (a
	// Router Alert, say): 20 to 60 bytes in, as the IHL says (the mask is the verifier's).
	quoted_ip_len = (quoted_ip->ihl * 4) & IPV4_HEADER_MAX;
	quoted_tcp = (void *)quoted_ip + quoted_ip_len;
	quoted_ts = (void *)(quoted_tcp + 1);
	if ((void *)quoted_tcp + ICMP_QUOTED_TCP_MIN > data_end)
		return hand_up(STAT_UP_LAYOUT);
	// The quoted packet went VIP -> client: a segment from this very VIP address.
	if (quoted_ip->saddr != ip->daddr)
		return drop_by_tables(seq, STAT_DROP_UNSUPPORTED_ICMP_TYPE);
	vip = tcp_vip_at(config->copy, quoted_ip->saddr, quoted_tcp->source);
	if (!vip) {
		// Its index of VIPs is the kernel's only if vips holds every one.
		if (config->flags & LB_EVERY_VIP)
			return drop_by_tables(seq, STAT_DROP_VIP_PORT_UNKNOWN);
		return hand_up(STAT_UP_OTHER);
	}
	nat = config->forwarding == LB_FORWARDING_NAT;
	if (config->mode != LB_MODE_CHEETAH) {
		// The baselines route by their pick; nothing in the quote but NAT's changes.
		long picked;

		if (vip->policy == KERNEL_POLICY_EMPTY)
			return drop_by_tables(seq, STAT_DROP_NO_SERVER_AVAILABLE);
		picked = icmp_baseline_pick(config, vip, quoted_ip->daddr, quoted_tcp->dest);
		if (picked < 0)
			return hand_up(STAT_UP_OTHER);
		id = picked;
		server = server_at(config->copy, id);
		if (!server || !(server->flags & SERVER_EGRESS))
			return hand_up(STAT_UP_NEXT_HOP);
		return icmp_forward_unrestored(ctx, seq, eth, ip, icmp, quoted_ip, quoted_tcp,
					       quote_len, quoted_ip_len, server, vip, nat,
					       STAT_FAST_ICMP_PICK);
	}
	// The cookie, where the core's `tsval_at` looks for it: a whole TCP header within the
	// quote (which ends with the IP packet) with room for a timestamp option, its options
	// starting NOP NOP TS or, else, the first timestamp option the core's walk finds in
	// them. The walk's answer without one, or malformed options, is the core's `None`
	// (no cookie: it routes by the fallback table or copies), not a drop.
	if ((void *)(quoted_ts + 1) <= data_end && quote_len >= quoted_ip_len + TCP_WITH_TS_LEN &&
	    quoted_tcp->doff * 4 >= TCP_WITH_TS_LEN &&
	    quoted_ip_len + quoted_tcp->doff * 4 <= quote_len) {
		at = *(__be32 *)quoted_ts == bpf_htonl(NOP_NOP_TS) ?
			     2 :
			     tcp_timestamp_walk(ctx, quoted_tcp);
		// Hidden from the verifier, so that what follows is verified once for both
		// finds.
		asm volatile("" : "+r"(at));
		option = tcp_timestamp_option_at(ctx, (__u8 *)quoted_ts, at);
	}
	// The connection's hash: its client is the quoted destination.
	hash = siphash_finish(vip->hash_prefix, quoted_ip->daddr, quoted_tcp->dest);
	if (!option) {
		// No cookie: the server the fallback table remembers, if it still forwards;
		// else userspace copies the error to every server of the VIP, unless it has
		// none (the core drops it).
		if (!fallback_find(config, hash, &hit))
			return icmp_to_all(seq, vip);
		id = fallback_server(hit.word);
		server = server_at(config->copy, id);
		if (!server || !(server->flags & SERVER_FORWARDS))
			return icmp_to_all(seq, vip);
		if (!(server->flags & SERVER_EGRESS))
			return hand_up(STAT_UP_NEXT_HOP);
		return icmp_forward_unrestored(ctx, seq, eth, ip, icmp, quoted_ip, quoted_tcp,
					       quote_len, quoted_ip_len, server, vip, nat,
					       STAT_FAST_ICMP_FALLBACK);
	}
	tsval = option + TCP_TIMESTAMP_TSVAL;
	__builtin_memcpy(&tsval_be, tsval, sizeof(tsval_be));
	old_tsval = bpf_ntohl(tsval_be);
	// A cookie naming an id no server has or a removed server is dropped, as the core
	// drops it; one whose server's clock is unknown is routed unrestored, as the core
	// routes it.
	server = route_by_cookie(config->copy, layout, old_tsval >> 16, hash, 1, &id, &restored,
				 &restore, &drop);
	if (!server && drop == STAT_DROP_COOKIE_UNKNOWN_SERVER)
		return drop_by_tables(seq, STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER);
	if (!server && drop == STAT_DROP_COOKIE_SERVER_REMOVED)
		return drop_by_tables(seq, STAT_DROP_ICMP_COOKIE_SERVER_REMOVED);
	if (!server)
		return LB_HAND_UP;
	target = *server;
	vip_port = vip->port;
	backend_port = vip->backend_port;
	if (!publish_unchanged(seq))
		return hand_up(STAT_UP_PUBLISHING);
	// The quoted TSval restored (the whole word written, as the core writes it, even when
	// the MSB is the same), then the quoted TCP checksum; each change folded into the
	// ICMP checksum, byte-swapped at an odd offset (the quoted TCP header sits at an even
	// one from the ICMP header, so the parity from either is the option's). A clock
	// unknown leaves the quote as it came.
	if (restore != COOKIE_CLOCK_UNKNOWN) {
		new_tsval = (__u32)bpf_ntohs(restored) << 16 | (old_tsval & 0xffff);
		icmp_write_option_u32(icmp, tsval, at & 1, old_tsval, new_tsval);
		icmp_write_u16(icmp, &quoted_tcp->check,
			       bpf_htons(csum_update_u32_at(bpf_ntohs(quoted_tcp->check), at & 1,
							    old_tsval, new_tsval)));
	}
	if (restore == COOKIE_RESTORED_LATE)
		count(STAT_ECHO_BEYOND_IDLE_LIMIT);
	return icmp_to_server(ctx, eth, ip, icmp, quoted_ip, quoted_tcp, quote_len, quoted_ip_len,
			      &target, nat, vip_port, backend_port, STAT_FAST_ICMP_COOKIE);
}

#endif
