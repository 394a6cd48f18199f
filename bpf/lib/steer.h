// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Steering: hands the packets the load balancer owns to its AF_XDP sockets and everything
// else to the host kernel. With the in-kernel path off this is the whole program; with it
// on, it is where every packet the kernel does not forward itself goes.
//
// Owned packets are IPv4 packets addressed to a VIP (client -> LB) and server replies
// (l2: sent from a VIP address; nat: sent from a backend DIP:port, unless addressed to one
// of the host's own addresses: the answers to the LB's health probes). For server replies the
// program also asks the kernel's FIB and neighbour table for the next hop toward the
// client and leaves the answer in front of the packet (write_meta), so the userspace
// data path never keeps its own routing state. When no socket is bound for the receiving
// queue (the LB is restarting, or was killed), owned packets are dropped rather than passed:
// the host kernel must never answer a load-balanced connection with a RST.

#ifndef CHEETAH_LIB_STEER_H
#define CHEETAH_LIB_STEER_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"
#include "stats.h"

#define AF_INET 2
// lo's ifindex in every network namespace (include/net/flow.h).
#define LOOPBACK_IFINDEX 1

static __always_inline int pass(void)
{
	count(STAT_PASSED);
	return XDP_PASS;
}

#define ETH_P_8021Q_TAG 0x8100
#define ETH_P_8021AD_TAG 0x88a8

// One 802.1Q or 802.1ad tag: its TCI and the EtherType after it.
struct vlan_tag {
	__be16 tci;
	__be16 proto;
};

// Whether `proto` is a VLAN tag's EtherType the core reads past (wire/ethernet.rs).
static __always_inline int vlan_tag_type(__be16 proto)
{
	return proto == bpf_htons(ETH_P_8021Q_TAG) || proto == bpf_htons(ETH_P_8021AD_TAG);
}

// The IPv4 header of a frame as the core's EthernetFrame finds it: untagged, or after one
// or two VLAN tags (802.1Q or 802.1ad); NULL for anything else, or a header cut short.
// Steering owns a tagged VIP packet as an untagged one: the workers take it, tag kept.
static __always_inline struct iphdr *steered_ipv4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct vlan_tag *tag = (void *)(eth + 1);
	struct iphdr *ip;

	if ((void *)(eth + 1) > data_end)
		return NULL;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		ip = (void *)(eth + 1);
	} else if (vlan_tag_type(eth->h_proto)) {
		if ((void *)(tag + 1) > data_end)
			return NULL;
		if (tag->proto == bpf_htons(ETH_P_IP)) {
			ip = (void *)(tag + 1);
		} else if (vlan_tag_type(tag->proto)) {
			if ((void *)(tag + 2) > data_end || tag[1].proto != bpf_htons(ETH_P_IP))
				return NULL;
			ip = (void *)(tag + 2);
		} else {
			return NULL;
		}
	} else {
		return NULL;
	}
	if ((void *)(ip + 1) > data_end)
		return NULL;
	return ip;
}

// Asks the kernel's FIB and neighbour table for the next hop of a server's reply toward
// its client: a bpf_fib_lookup return code, with `fib` filled as the helper fills it.
static __always_inline int fib_toward_client(struct xdp_md *ctx, const struct iphdr *ip,
					     __u32 ip_len, struct bpf_fib_lookup *fib)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->tos = ip->tos;
	fib->l4_protocol = ip->protocol;
	fib->tot_len = ip_len;
	fib->ipv4_src = ip->saddr;
	fib->ipv4_dst = ip->daddr;
	// Looked up as if the reply came in on lo, not on the interface it came in on: the
	// helper refuses unless forwarding is on for params->ifindex, and the kernel forwards
	// a received packet when forwarding is on for its ingress device. With forwarding on
	// for lo only, where nothing but this host's own packets arrive, the LB's interfaces
	// keep forwarding off and the host routes nothing for clients (docs/dataplane.md).
	// The answer does not depend on it: egress device, MACs, gateway and MTU come from
	// the route found; only policy rules that select by incoming interface see lo.
	fib->ifindex = LOOPBACK_IFINDEX;

	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

static __always_inline __u32 next_hop(struct xdp_md *ctx, struct iphdr *ip, __u32 ip_len,
				      struct cheetah_meta *meta)
{
	struct bpf_fib_lookup fib;
	int rc = fib_toward_client(ctx, ip, ip_len, &fib);

	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		meta->ifindex = fib.ifindex;
		__builtin_memcpy(meta->dmac, fib.dmac, 6);
		__builtin_memcpy(meta->smac, fib.smac, 6);
		return META_FIB_OK;
	}
	meta->ifindex = fib.ifindex;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		// The kernel resolves the neighbour when userspace asks it to; tell it whom.
		__builtin_memcpy(meta->dmac, &fib.ipv4_dst, 4);
		return META_FIB_NO_NEIGH;
	}
	meta->ifindex = rc;
	return META_FIB_FAILED;
}

// Puts the direction and, for server replies, the next hop in front of the frame, as the
// first META_LEN bytes of the packet itself (bpf_xdp_adjust_head): the socket's reader
// takes them off (dataplane/xsk.rs `receive`). Not XDP metadata (bpf_xdp_adjust_meta):
// some kernels refuse that helper to XDP programs, and drivers without metadata support
// fail it at run time, while every XDP driver has headroom. Written last, with the frame
// as it will leave (tags and IP options back, lb.h), so nothing moves it after. 0 if
// there was no room, the frame then as it came.
static __always_inline int write_meta(struct xdp_md *ctx, __u32 flags)
{
	struct cheetah_meta meta = {};
	struct cheetah_meta *front;
	struct iphdr *ip;

	// Past any VLAN tags, as steer_owner found it.
	ip = steered_ipv4(ctx);
	if (!ip)
		return 0;
	if (flags & META_FROM_SERVER)
		flags |= next_hop(ctx, ip, bpf_ntohs(ip->tot_len), &meta);
	meta.magic = META_MAGIC;
	meta.flags = flags;
	if (bpf_xdp_adjust_head(ctx, -(int)sizeof(meta)))
		return 0;
	front = (void *)(long)ctx->data;
	if ((void *)(front + 1) > (void *)(long)ctx->data_end) {
		bpf_xdp_adjust_head(ctx, (int)sizeof(meta));
		return 0;
	}
	__builtin_memcpy(front, &meta, sizeof(meta));
	return 1;
}

// Whose packet this is: META_TO_VIP, META_FROM_SERVER, or 0 for the host kernel's. A NAT
// backend's reply also gets its backends entry in `backend` (else NULL).
// `copy`: of the published tables (publish.h).
static __always_inline __u32 steer_owner(struct xdp_md *ctx, __u32 copy,
					 struct backend_info **backend)
{
	struct vip_addr_key addr = { .copy = copy };
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = steered_ipv4(ctx);

	*backend = NULL;
	if (!ip)
		return 0;
	addr.addr = ip->daddr;
	if (bpf_map_lookup_elem(&vip_addrs, &addr))
		return META_TO_VIP;
	addr.addr = ip->saddr;
	if (bpf_map_lookup_elem(&vip_addrs, &addr))
		return META_FROM_SERVER;
	if (ip->protocol == IPPROTO_TCP && ip->ihl >= 5) {
		struct tcphdr *tcp = (void *)ip + ip->ihl * 4;
		struct backend_key key = {};
		struct backend_info *found;

		// The ports are all the core reads to find the backend (worker.rs `classify`):
		// a segment too short for a whole TCP header is still the backend's, for the LB
		// to drop as the core does (`truncated_tcp`), not the host's.
		if ((void *)tcp + 4 > data_end)
			return 0;
		key.addr = ip->saddr;
		key.port = tcp->source;
		key.copy = copy;
		found = bpf_map_lookup_elem(&backends, &key);
		if (!found)
			return 0;
		// From a backend but to this host, not to a client: the answer to a health
		// probe (or to any connection the host itself made to the server). It is the
		// kernel's: the prober reads it on its raw socket, and as no socket owns the
		// probe's port, the kernel answers the SYN-ACK with a RST, which closes the
		// server's half-open connection at once. The reply path must never see it: it
		// would be taken for a reply to a client, "un-NATed" to the VIP and sent on.
		// Only NAT backends need the check: an l2 reply comes from a VIP address, and a
		// probe answer from the server's DIP passes above.
		if (bpf_map_lookup_elem(&host_addrs, &ip->daddr))
			return 0;
		*backend = found;
		return META_FROM_SERVER;
	}
	return 0;
}

// What the LB returns for a packet it hands to a socket: `owner` (steer_owner's flags)
// above every XDP action, so that the program steers it only after the frame has its tags
// and IP options back (lb.h `lb_process`).
#define LB_TO_SOCKET 0x100

static __always_inline int to_socket(__u32 owner)
{
	return LB_TO_SOCKET | (owner & (META_TO_VIP | META_FROM_SERVER));
}

// Hands an owned packet (`flags` from steer_owner) to the AF_XDP socket of its interface
// and queue, with the metadata in front (write_meta). A frame no socket takes is dropped
// as it came. Global: verified once, whatever state the LB's paths leave.
__noinline int steer_to_socket(struct xdp_md *ctx, __u32 flags)
{
	__u32 ifindex, queue, key;
	__u32 *slot;
	int action;

	if (!ctx)
		return XDP_DROP;
	ifindex = ctx->ingress_ifindex;
	queue = ctx->rx_queue_index;
	slot = bpf_map_lookup_elem(&interface_slots, &ifindex);
	if (!slot || queue >= MAX_QUEUES) {
		count(STAT_NO_SOCKET);
		return XDP_DROP;
	}
	key = *slot * MAX_QUEUES + queue;
	// A frame without it would lose its first bytes to the reader: dropped instead.
	if (!write_meta(ctx, flags)) {
		count(STAT_NO_METADATA_ROOM);
		return XDP_DROP;
	}
	// Lower bits of the flags are the action when no socket is bound: drop.
	action = bpf_redirect_map(&xsks, key, XDP_DROP);
	if (action == XDP_REDIRECT) {
		count(STAT_TO_SOCKET);
		return action;
	}
	count(STAT_NO_SOCKET);
	bpf_xdp_adjust_head(ctx, (int)sizeof(struct cheetah_meta));
	return action;
}

// The program's verdict for what the LB decided: a frame for a socket is steered now
// (to_socket), anything else is the LB's XDP action.
static __always_inline int steer_if_asked(struct xdp_md *ctx, int decided)
{
	if (decided >= LB_TO_SOCKET)
		return steer_to_socket(ctx, (__u32)decided);
	return decided;
}

#endif
