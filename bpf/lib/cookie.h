// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The TCP-timestamp cookie, bit for bit crates/core/src/cookie/tcp_ts.rs `CookieLayout`
// (encode, unmask, server), and the two reads of the clock table the per-packet paths make
// (crates/core/src/cookie/msb.rs): the restore entry of an unmasked cookie
// (`restore_unmasked`) and whether a reply's MSB changes nothing (`learn`'s `Unchanged`).
//
//  TSval toward the client:  | epoch : k | (server id XOR h) : 16 - k | server's low 16 bits |
//  TSecr from the client:      the same 16 MSB echoed back           | low 16 bits          |
//
// `h` is the id bits of the upper half of the connection's keyed hash (siphash.h), so that
// they are independent of the `h % n` of hash-based policies. The clock words are read
// through a map passed in, not maps.h's, so a later server-side program can include this
// file and siphash.h alone.

#ifndef CHEETAH_LIB_COOKIE_H
#define CHEETAH_LIB_COOKIE_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"

// The value of the one entry of msb_seen and of msb_restores (maps.h): every word of the
// clock table, contiguous as the core's MsbTable and userspace's mapping of it have them.
struct msb_seen_words {
	__u32 word[SERVER_ID_SPACE];
};

struct msb_restore_words {
	__u32 word[COOKIE_SPACE];
};

// What a cookie needs of the layout: `id_bits` = 16 - epoch bits, `id_mask` = (1 <<
// id_bits) - 1 (struct lb_config carries both).
struct cookie_layout {
	__u8 id_bits;
	__u16 id_mask;
};

// `CookieLayout::mask`: the id bits a connection's cookie is masked with.
static __always_inline __u16 cookie_mask(struct cookie_layout layout, __u64 flow_hash)
{
	return (__u16)(flow_hash >> 32) & layout.id_mask;
}

// `CookieLayout::encode`: the 16-bit cookie for `server`, carrying the low k bits of the
// server's MSB.
static __always_inline __u16 cookie_encode(struct cookie_layout layout, __u16 server,
					   __u64 flow_hash, __u16 server_msb)
{
	return (__u16)((__u32)server_msb << layout.id_bits) |
	       ((server ^ cookie_mask(layout, flow_hash)) & layout.id_mask);
}

// `CookieLayout::unmask`: the echoed cookie with its connection's mask taken off, which
// indexes the restore entries.
static __always_inline __u16 cookie_unmask(struct cookie_layout layout, __u16 cookie,
					   __u64 flow_hash)
{
	return cookie ^ cookie_mask(layout, flow_hash);
}

// `CookieLayout::server`: the server id an unmasked cookie names (the constant bound is
// implied by the mask; spelt out, it keeps every array it indexes in bounds).
static __always_inline __u32 cookie_server(struct cookie_layout layout, __u16 unmasked)
{
	return unmasked & layout.id_mask & (SERVER_ID_SPACE - 1);
}

// cookie_restore's answers.
#define COOKIE_RESTORED 1
// Restored, more than 2^(k-1) periods behind the server's newest MSB: the core counts it
// (`echoes_beyond_idle_limit`); the kernel, once it forwards the packet,
// STAT_ECHO_BEYOND_IDLE_LIMIT.
#define COOKIE_RESTORED_LATE 2
#define COOKIE_CLOCK_UNKNOWN 0 // a client's echo the core drops (`ts_msb_unknown`)
#define COOKIE_FOR_THE_CORE -1 // no map

// `MsbTable::restore_unmasked` for the straight line: the two bytes that replace the
// echoed cookie (the restored MSB, as it lies in the packet: the entry keeps it in network
// order), read from `restores`, an msb_restores-shaped map (one entry: every word).
// COOKIE_RESTORED, COOKIE_RESTORED_LATE, COOKIE_CLOCK_UNKNOWN, or COOKIE_FOR_THE_CORE.
static __always_inline int cookie_restore(void *restores, __u16 unmasked, __u16 *restored)
{
	__u32 zero = 0;
	struct msb_restore_words *words = bpf_map_lookup_elem(restores, &zero);
	__u32 word;

	if (!words)
		return COOKIE_FOR_THE_CORE;
	word = words->word[unmasked];
	if (!(word & MSB_KNOWN))
		return COOKIE_CLOCK_UNKNOWN;
	*restored = (__u16)word;
	return word & MSB_BEYOND_IDLE_LIMIT ? COOKIE_RESTORED_LATE : COOKIE_RESTORED;
}

// `MsbTable::learn`'s first test: a reply whose MSB is the newest seen, or the one before
// it, changes nothing; anything else (a new period, a clock going backwards, a server never
// seen) is for the core to learn. `seen` is the server's msb_seen word.
static __always_inline int cookie_clock_unchanged(__u32 seen, __u16 msb)
{
	return seen == (MSB_KNOWN | msb) || seen == (MSB_KNOWN | (__u16)(msb + 1));
}

#endif
