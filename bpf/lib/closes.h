// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Which server FINs and RSTs count as a connection's close, bit for bit
// crates/core/src/lb/closes.rs: a FIN, or an RST with a timestamp option, counts when its
// slot of the close filter holds another tag, which it then writes in. The filter's words
// are the closes map (maps.h), which the core's CloseFilter shares, so a close counted on
// one side is a duplicate on the other. As in the core, a plain load and (for a first
// close) a plain store, not an atomic swap: see closes.rs for why a rare race costs one
// extra decrement at most.
//
// Split in two for the program's decide-then-commit shape: `close_seen` only reads,
// `close_record` writes, after everything else about the packet is decided.

#ifndef CHEETAH_LIB_CLOSES_H
#define CHEETAH_LIB_CLOSES_H

#include <linux/types.h>

#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"
#include "parse.h"

// One close: the slot it is filed under and the tag it leaves there.
// One close: the slot it is filed under and the tag it leaves there. No pointer: it is
// kept in reply_scratch (maps.h), from which a pointer would read back as a number.
struct close {
	__u32 index; // the slot's, in closes
	__u32 tag;
};

// `Close::of_segment` and `Close::tag` for a segment with FIN or RST in `flags`: the
// sequence number the close occupies (an RST's minus one, so the RST a server sends one
// past its FIN is the FIN's close; a FIN's after its SYN and data) mixed with the flow
// hash's high half; never 0, an empty slot's value.
static __always_inline __u32 close_tag(__u64 flow_hash, __u8 flags, __u32 seq, __u32 data_len)
{
	__u32 at, tag;

	if (flags & TCP_RST)
		at = seq - 1;
	else
		at = seq + ((flags & TCP_SYN) ? 1 : 0) + data_len;
	tag = (__u32)(flow_hash >> 32) ^ at;
	return tag ? tag : 1;
}

// The close of a segment in `words` (the closes map's entry), and whether it is the first
// its slot has seen: `CloseFilter::first`'s load.
static __always_inline int close_seen(struct close_words *words, __u64 flow_hash, __u8 flags,
				       __u32 seq, __u32 data_len, struct close *close)
{
	close->index = flow_hash & (CLOSE_SLOTS - 1);
	close->tag = close_tag(flow_hash, flags, seq, data_len);
	return *(volatile __u32 *)&words->word[close->index] != close->tag;
}

// `CloseFilter::first`'s store, for a first close.
static __always_inline void close_record(const struct close *close)
{
	__u32 zero = 0;
	struct close_words *words = bpf_map_lookup_elem(&closes, &zero);

	if (words)
		*(volatile __u32 *)&words->word[close->index & (CLOSE_SLOTS - 1)] = close->tag;
}

#endif
