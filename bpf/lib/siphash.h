// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// SipHash-1-3 of a connection id, finished from its VIP's prefix: bit for bit
// crates/core/src/hash/siphash.rs `VipHashPrefix::finish`. Why keyed, why this id layout
// and why a prefix are explained there: the cookie is `server id XOR hash`, so the hash
// must be a PRF of a secret, and the VIP's side of the id fills SipHash's first word
// exactly, so the state after it (computed once per VIP by userspace, `vip_info.hash_prefix`)
// leaves four of the five SipRounds per packet. Needs no map: a later server-side program
// can include this file alone.

#ifndef CHEETAH_LIB_SIPHASH_H
#define CHEETAH_LIB_SIPHASH_H

#include <linux/types.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "siphash_finish reads the id's words as the fields lie in memory: little-endian only"
#endif

static __always_inline __u64 siphash_rotl(__u64 word, int bits)
{
	return (word << bits) | (word >> (64 - bits));
}

#define SIPROUND(v0, v1, v2, v3)                                                               \
	do {                                                                                   \
		v0 += v1;                                                                      \
		v1 = siphash_rotl(v1, 13);                                                     \
		v1 ^= v0;                                                                      \
		v0 = siphash_rotl(v0, 32);                                                     \
		v2 += v3;                                                                      \
		v3 = siphash_rotl(v3, 16);                                                     \
		v3 ^= v2;                                                                      \
		v0 += v3;                                                                      \
		v3 = siphash_rotl(v3, 21);                                                     \
		v3 ^= v0;                                                                      \
		v2 += v1;                                                                      \
		v1 = siphash_rotl(v1, 17);                                                     \
		v1 ^= v2;                                                                      \
		v2 = siphash_rotl(v2, 32);                                                     \
	} while (0)

// The hash of the id of `client_addr:client_port` (both as they lie in the packet, network
// order) with the VIP whose prefix is `prefix`. The id's second word is bytes 8..14, the
// client's address and port in network order, read little-endian, with the length (14) in
// the top byte: on a little-endian machine that is the packet's fields loaded as they are.
static __always_inline __u64 siphash_finish(const __u64 prefix[4], __be32 client_addr,
					    __be16 client_port)
{
	__u64 m = (__u64)(__u32)client_addr | ((__u64)(__u16)client_port << 32) | (14ULL << 56);
	__u64 v0 = prefix[0], v1 = prefix[1], v2 = prefix[2], v3 = prefix[3];

	v3 ^= m;
	SIPROUND(v0, v1, v2, v3);
	v0 ^= m;
	v2 ^= 0xff;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

#endif
