// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Incremental Internet checksum updates (RFC 1624 eqn. 3), bit for bit those of
// crates/core/src/wire/checksum.rs and of the header setters that use them
// (wire/ipv4.rs `set_src`/`set_dst`, wire/tcp.rs `update_checksum_for_address` and
// `set_src_port`/`set_dst_port`). A parity test compares the kernel's bytes with the
// core's, so even the two encodings of zero (0x0000, 0xffff) must come out the same:
// the formulas below are the core's, in the same order, on the same host-order words.
// Like the core, nothing is ever verified or recomputed: a packet that arrived with a bad
// checksum leaves with one exactly as bad.

#ifndef CHEETAH_LIB_CSUM_H
#define CHEETAH_LIB_CSUM_H

#include <linux/types.h>
#include <bpf/bpf_endian.h>

// checksum.rs `fold`: one end-around carry is enough (halves summing over 16 bits give at
// most 0xfffe, so adding the carry back cannot overflow again).
static __always_inline __u16 csum_fold(__u32 acc)
{
	__u32 sum = (acc & 0xffff) + (acc >> 16);

	return (__u16)((sum & 0xffff) + (sum >> 16));
}

// checksum.rs `update_u16`: one 16-bit field at an even offset, host order.
static __always_inline __u16 csum_update_u16(__u16 check, __u16 old, __u16 new)
{
	return (__u16)~csum_fold((__u32)(__u16)~check + (__u16)~old + new);
}

// checksum.rs `update_u32`: one 32-bit field at an even offset (an IPv4 address), host
// order.
static __always_inline __u16 csum_update_u32(__u16 check, __u32 old, __u32 new)
{
	__u32 acc = (__u32)(__u16)~check + (__u16)~(old >> 16) + (__u16)~(old & 0xffff) +
		    (new >> 16) + (new & 0xffff);

	return (__u16)~csum_fold(acc);
}

// checksum.rs `update_u32_at`: a 32-bit field at any offset from the start of the
// checksummed region, host order. At an odd offset each of its bytes sits in the other half
// of a 16-bit word than its position in the field says, so the change is folded on its own
// and byte-swapped before it joins the sum, in the core's order.
static __always_inline __u16 csum_update_u32_at(__u16 check, int odd_offset, __u32 old, __u32 new)
{
	__u16 delta;

	if (!odd_offset)
		return csum_update_u32(check, old, new);
	delta = csum_fold((__u32)(__u16)~(old >> 16) + (__u16)~(old & 0xffff) + (new >> 16) +
			  (new & 0xffff));
	delta = (__u16)(delta << 8 | delta >> 8);
	return (__u16)~csum_fold((__u32)(__u16)~check + delta);
}

// tcp.rs `rewrite_option_u32`: the 32-bit word at `field` (in a TCP option, at any offset
// `odd_offset` says the parity of, from the TCP header) becomes `value` (host order), the
// checksum at `check` follows; nothing is written when the word is unchanged. Byte copies,
// as the word may sit at any offset.
static __always_inline void csum_rewrite_option_u32(__u8 *field, __u16 *check, int odd_offset,
						    __u32 value)
{
	__be32 old_be, new_be = bpf_htonl(value);
	__u32 old;

	__builtin_memcpy(&old_be, field, sizeof(old_be));
	old = bpf_ntohl(old_be);
	if (old == value)
		return;
	__builtin_memcpy(field, &new_be, sizeof(new_be));
	*check = bpf_htons(csum_update_u32_at(bpf_ntohs(*check), odd_offset, old, value));
}

// checksum.rs `replace_high_half_in_network_order`: the first two bytes of a 32-bit word at
// an even offset from the start of the checksummed region become `new` (as it lies in
// memory), the checksum at `check` follows. The words are summed as they lie in memory
// (ones'-complement sums commute with byte swaps), and nothing at all is written when the
// half is unchanged: eqn. 3 would turn a 0xffff checksum into 0.
static __always_inline void csum_replace_high_half_in_network_order(__u16 *word, __u16 *check,
								    __u16 new)
{
	__u16 old = *word;
	__u16 sum;

	if (old == new)
		return;
	*word = new;
	sum = *check;
	// ~sum + ~old + new + ~low + low, with each ~x of a 16-bit word written 0xffff - x.
	*check = (__u16)~csum_fold(0x2fffd + (__u32)new - sum - old);
}

// checksum.rs `replace_high_half`: the same with the new half in host order.
static __always_inline void csum_replace_high_half(__u16 *word, __u16 *check, __u16 new_high)
{
	csum_replace_high_half_in_network_order(word, check, bpf_htons(new_high));
}

// ipv4.rs `set_addr` (`set_src`, `set_dst`): writes the address, updates the header
// checksum even when the address is the same (as the core does), and returns the old
// address (network order) for the L4 checksum.
static __always_inline __be32 csum_set_ipv4_addr(__u16 *ip_check, __be32 *field, __be32 addr)
{
	__be32 old = *field;

	*field = addr;
	*ip_check = bpf_htons(csum_update_u32(bpf_ntohs(*ip_check), bpf_ntohl(old), bpf_ntohl(addr)));
	return old;
}

// tcp.rs `update_checksum_for_address`: the pseudo-header's address changed.
static __always_inline void csum_tcp_address_changed(__u16 *tcp_check, __be32 old, __be32 addr)
{
	*tcp_check =
		bpf_htons(csum_update_u32(bpf_ntohs(*tcp_check), bpf_ntohl(old), bpf_ntohl(addr)));
}

// tcp.rs `set_port` (`set_src_port`, `set_dst_port`).
static __always_inline void csum_set_tcp_port(__u16 *tcp_check, __be16 *field, __be16 port)
{
	__be16 old = *field;

	*field = port;
	*tcp_check = bpf_htons(csum_update_u16(bpf_ntohs(*tcp_check), bpf_ntohs(old), bpf_ntohs(port)));
}

#endif
