// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Where a client's SYN to a cheetah-mode VIP goes, decided as the core's client_path.rs
// decides it from `find_timestamp`: a timestamp option, where one of Table 1's layouts
// puts it or wherever the core's walk finds it (timestamp_walk), takes the VIP's policy
// (syn_fast, fast_path.h); options the walk finds well formed and without a timestamp make
// it a connection without timestamps, placed by the VIP's Maglev table and remembered
// (fallback_syn, fallback.h); malformed options are dropped, counted under the core's
// reason.
// A SYN without any options is client_fallback's (fallback.h).

#ifndef CHEETAH_LIB_CLIENT_SYN_H
#define CHEETAH_LIB_CLIENT_SYN_H

#include <linux/bpf.h>

#include "cheetah_shared.h"
#include "fallback.h"
#include "fast_path.h"
#include "parse.h"
#include "siphash.h"

// Whether a client segment in cheetah mode is client_syn's: SYN without ACK (the core's
// SegmentKind::Syn).
static __always_inline int is_client_syn(const struct lb_config *config,
					 const struct plain_tcp *p)
{
	return config->mode == LB_MODE_CHEETAH &&
	       (tcp_flags(p->tcp) & (TCP_SYN | TCP_ACK)) == TCP_SYN;
}

// A client SYN with TCP options (PLAIN_OK) to TCP VIP `vip` in cheetah mode.
static __always_inline int client_syn(struct xdp_md *ctx, const struct lb_config *config,
				      __u32 seq, const struct plain_tcp *p,
				      const struct vip_info *vip)
{
	int walked = 0, at;

	if (!syn_timestamp_at(ctx, p)) {
		at = timestamp_walk(ctx, p);
		if (at == TIMESTAMP_NONE)
			return fallback_syn(ctx, config, seq, p, vip,
					    siphash_finish(vip->hash_prefix, p->ip->saddr,
							   p->tcp->source));
		if (timestamp_malformed(at))
			return drop_malformed_options(STAT_DROP_TCP_OPTION_TRUNCATED, at);
		if (at < 0)
			return hand_up(STAT_UP_LAYOUT);
		walked = 1;
	}
	// The policy needs only to know there is a timestamp, not where. Hidden from the
	// verifier, so that syn_fast is verified once for both finds, not once for each.
	asm volatile("" : "+r"(walked));
	return syn_fast(ctx, config, seq, p, vip, walked);
}

#endif
