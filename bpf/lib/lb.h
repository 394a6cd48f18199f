// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The whole LB program as one inline function, so that bpf/xdp_lb.c is only its section
// and the bench wrapper (bpf/xdp_bench.c) runs exactly the same code. A tagged frame is
// decided untagged (vlan.h), a segment with IP options without them (ip_options.h).
//
// Every packet is first classified as steering always did (a VIP's client segment, a
// server's reply, or the host's); with the in-kernel path on, a client's segment by its
// VIP and a server's reply the reply_senders map knows (reply_sender.h) skip steering's
// lookups. With lb_config's LB_FAST_PATH set, the kernel forwards what the core's
// straight line would (fast_path.h), a client's SYN as the core places it (client_syn.h)
// and the client segments without options (fallback.h); everything else, and everything when
// the flag is clear (lb_config as loaded is all zero), goes to the AF_XDP sockets exactly
// as before (steer.h). A packet to a VIP address that is not TCP may be an ICMP error the
// kernel routes by its quoted cookie (icmp_path.h).

#ifndef CHEETAH_LIB_LB_H
#define CHEETAH_LIB_LB_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "client_syn.h"
#include "fallback.h"
#include "fast_path.h"
#include "icmp_path.h"
#include "ip_options.h"
#include "maps.h"
#include "not_a_vip.h"
#include "publish.h"
#include "reply_sender.h"
#include "steer.h"
#include "vip_addr_filter.h"
#include "vip_slots.h"
#include "vlan.h"

static __always_inline int lb_decide(struct xdp_md *ctx, __u32 ip_options_lifted)
{
	enum plain_refusal refusal = PLAIN_LAYOUT;
	const struct reply_sender *sender = NULL;
	const struct vip_slot *slot = NULL;
	struct reply_sender by_steering;
	struct backend_info *backend;
	struct vip_info *vip = NULL;
	struct lb_config *config = NULL, *entry0;
	// Set on every path: clang may carry its fields in registers the verifier must see written.
	struct plain_tcp p = { .ip_options_lifted = ip_options_lifted };
	__u32 zero = 0, owner = 0, seq = 0, copy = 0;
	int fast, action, cookie = 0, without_timestamp = 0, dropped = LB_HAND_UP;
	// Where an established segment's timestamp option starts within its options, and
	// whether the walk found it there (not the straight line's NOP NOP TS).
	int ts_at = 0, walked = 0;
	// A segment without SYN and ACK (an RST, mostly) whose timestamp echoes nothing; a
	// client's SYN-ACK (backscatter of a SYN flood that spoofed a VIP's address, mostly),
	// which the core routes by its cookie on its general path; and whether the compare
	// found the timestamp of either (NOP NOP TS first, or where Table 1 puts a SYN's),
	// where the STAT_FAST_* entry that counts the packet stands for the walk's find.
	int unechoed = 0, answer = 0, compared = 0;

	// The word first, then every published map from the copy it names (publish.h).
	entry0 = bpf_map_lookup_elem(&lb_config, &zero);
	if (entry0) {
		seq = publish_begin(entry0);
		copy = publish_copy(seq);
		config = bpf_map_lookup_elem(&lb_config, &copy);
	}
	fast = config && (config->flags & LB_FAST_PATH);
	if (fast) {
		// A client's segment is recognised by its VIP (address, port) alone: vips and
		// vip_slots only hold what vip_addrs holds (the publisher keeps it so), so a hit
		// is a packet steering would call META_TO_VIP, and one lookup replaces two; an
		// address the VIP filter says is no VIP's needs none at all. The commonest
		// segment, a client's established one in cheetah mode, finds its VIP by an array
		// read in vip_slots (vip_slots.h); any other, or one whose VIP has no slot, in vips.
		refusal = parse_plain_tcp(ctx, &p);
		if (plain_tcp_set(refusal) && may_be_vip_addr(config, p.ip->daddr)) {
			// The options' walk (timestamp_walk) only when they do not start NOP NOP TS.
			// Options too short for a timestamp are walked too (none, or malformed).
			// A segment without SYN and ACK looks for its timestamp as an established
			// one does (SegmentKind::Other), then is routed as one without (TSecr
			// echoes nothing: client_path.rs).
			// A client's SYN-ACK looks for it as a SYN does, and takes the cookie stage
			// as a walked timestamp (the core's general path) whoever found it.
			unechoed = refusal == PLAIN_OK && !(tcp_flags(p.tcp) & (TCP_SYN | TCP_ACK));
			answer = refusal == PLAIN_OK &&
				 (tcp_flags(p.tcp) & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK);
			if (config->mode == LB_MODE_CHEETAH &&
			    (refusal == PLAIN_SHORT_OPTIONS ||
			     (refusal == PLAIN_OK && (established(&p) || unechoed || answer)))) {
				if (answer && (ts_at = syn_timestamp_at(ctx, &p))) {
					walked = 1;
					compared = 1;
				} else if (!answer && refusal == PLAIN_OK &&
					   plain_has_nop_nop_ts(&p)) {
					ts_at = 2;
				} else {
					ts_at = timestamp_walk(ctx, &p);
					walked = ts_at >= 0;
					without_timestamp = ts_at == TIMESTAMP_NONE;
				}
				// (Options too short for one never hold a timestamp.)
				cookie = ts_at >= 0 && refusal == PLAIN_OK && !unechoed;
				if (unechoed && ts_at >= 0) {
					compared = !walked;
					without_timestamp = 1;
				}
				// Hidden from the verifier, so that the cookie stage is verified once
				// for the compare's find and the walk's, not once for each.
				asm volatile("" : "+r"(ts_at), "+r"(walked));
			}
			if (cookie)
				slot = vip_slot_at(copy, p.ip->daddr, p.tcp->dest);
			if (!slot)
				vip = client_vip(copy, &p);
		}
		if (cookie && (slot || vip)) {
			// One call for both maps' answers, so the cookie stage is inlined once.
			const __u64 *hash_prefix = slot ? slot->hash_prefix : vip->hash_prefix;
			__be16 vip_port = slot ? slot->port : vip->port;
			__be16 backend_port = slot ? slot->backend_port : vip->backend_port;

			action = client_by_cookie(ctx, config, seq, &p, hash_prefix, vip_port,
						  backend_port, ts_at, walked);
			if (action != LB_HAND_UP) {
				if (compared)
					count(STAT_OPTIONS_COMPARED);
				return action;
			}
		} else if (vip) {
			int cheetah = config->mode == LB_MODE_CHEETAH;

			// No timestamp (no options, or none the walk found): the fallback table
			// routes it (fallback.h). The baselines pick for it as for any other
			// segment, on the core's general path (client_fast).
			if ((refusal == PLAIN_NO_OPTIONS && cheetah) || without_timestamp) {
				action = client_fallback(ctx, config, seq, &p, vip);
				// Its entry stands for the walk's count; the core counted the
				// compare's.
				if (compared && action != LB_HAND_UP)
					count(STAT_OPTIONS_COMPARED);
			}
			// Options the walk found malformed (only a cheetah-mode walk sets
			// ts_at below 0): the core drops the segment, and so does the kernel.
			else if (timestamp_malformed(ts_at))
				action = drop_malformed_options(STAT_DROP_TCP_OPTION_TRUNCATED,
								ts_at);
			else if (refusal == PLAIN_SHORT_OPTIONS && cheetah)
				action = hand_up(STAT_UP_LAYOUT); // the walk did not run
			else if (is_client_syn(config, &p))
				action = client_syn(ctx, config, seq, &p, vip);
			else
				action = client_fast(ctx, config, seq, &p, vip,
						     refusal == PLAIN_OK ? STAT_FAST_CLIENT_PICK :
									   STAT_FAST_CLIENT_PICK_GENERAL);
			if (action != LB_HAND_UP)
				return action;
		} else if (plain_tcp_set(refusal)) {
			// A server's reply the reply_senders map knows needs no steering first.
			sender = reply_known(ctx, config, &p);
		}
	}
	if (!sender) {
		owner = steer_owner(ctx, copy, &backend);
		if (!owner)
			return pass();
		if (!fast || vip || slot)
			return to_socket(owner);
		// A garbled IP header (never the straight line's; parse_plain_tcp tells another
		// protocol from its first bytes only): the core drops the packet before it looks
		// at anything else.
		if (refusal == PLAIN_LAYOUT || refusal == PLAIN_NOT_TCP) {
			action = drop_bad_ipv4_header(ctx);
			if (action != LB_HAND_UP)
				return action;
		}
		if (owner & META_TO_VIP) {
			// A fragment to a VIP address: the core drops it, whatever it carries.
			if (refusal != PLAIN_OK && ipv4_fragment(ctx)) {
				count(STAT_DROP_UNSUPPORTED_FRAGMENT);
				return XDP_DROP;
			}
			action = not_a_vip(ctx, config, seq, refusal);
			if (action != LB_HAND_UP)
				return action;
			if (refusal == PLAIN_NOT_TCP)
				action = icmp_fast(ctx, config, seq);
			else
				action = client_not_found(refusal);
			if (action != LB_HAND_UP)
				return action;
			return to_socket(owner);
		}
		sender = reply_by_steering(ctx, config, seq, backend, &p, refusal, &by_steering,
					   &dropped);
		if (!sender)
			return dropped != LB_HAND_UP ? dropped :
						       to_socket(owner);
	}
	action = reply_fast(ctx, config, seq, sender, &p);
	if (action != LB_HAND_UP)
		return action;
	if (!owner) {
		// Found before steering ran: steered now, as it always was.
		owner = steer_owner(ctx, copy, &backend);
		if (!owner)
			return pass();
	}
	return to_socket(owner);
}

// The LB as a global function: the verifier checks it once, on its own, whatever state
// its callers reach it in (the option and tag wrappers reach it on four paths), where an
// inlined copy would be walked once per path. `ip_options_lifted` is any u32 to it.
__noinline int cheetah_decide(struct xdp_md *ctx, __u32 ip_options_lifted)
{
	return lb_decide(ctx, ip_options_lifted);
}

// The LB on an untagged frame, its IP options lifted while it decides.
static __always_inline int lb_untagged(struct xdp_md *ctx)
{
	return with_ip_options_lifted(ctx, cheetah_decide);
}

// The program: the LB on the frame, a tagged frame's tags lifted while it decides, then
// its IP options; a frame it hands up is steered to its socket once both are back.
static __always_inline int lb_process(struct xdp_md *ctx)
{
	return steer_if_asked(ctx, with_tags_lifted(ctx, lb_untagged));
}

#endif
