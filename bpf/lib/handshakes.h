// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The core's HandshakeTable (crates/core/src/lb/handshakes.rs) over the words it shares
// with userspace (cheetah_shared.h struct handshake_words): the same slots, fingerprints,
// retry filter and clock units, so that a SYN booked by the kernel is known to the core's
// workers and the reverse. The core's relaxed loads and stores are plain volatile accesses
// here, its swap an atomic exchange.

#ifndef CHEETAH_LIB_HANDSHAKES_H
#define CHEETAH_LIB_HANDSHAKES_H

#include <linux/types.h>

#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"

#define HANDSHAKE_VALID (1ull << 63)
#define HANDSHAKE_ANSWERED (1ull << 62)
#define HANDSHAKE_HOLDER_SHIFT 32
#define HANDSHAKE_HOLDER_MASK 0x7fffull
// The retry filter's clock: now >> RETRY_UNIT_SHIFT; a mark lasts RETRY_MEMORY_UNITS.
#define RETRY_UNIT_SHIFT 30
#define RETRY_MEMORY_UNITS 64
#define RETRY_MARKED 0x8000
#define RETRY_UNIT_MASK 0x7fff

static __always_inline __u64 handshake_fingerprint(__u64 flow_hash, __u32 client_isn)
{
	return (__u32)((__u32)(flow_hash >> 32) ^ client_isn);
}

static __always_inline __u32 handshake_retry_index(__u64 flow_hash)
{
	return (flow_hash >> 20) & (HANDSHAKE_RETRY_SLOTS - 1);
}

static __always_inline __u16 handshake_unit(__u64 now)
{
	return (now >> RETRY_UNIT_SHIFT) & RETRY_UNIT_MASK;
}

// `HandshakeTable::retried_recently`.
static __always_inline int handshake_retried_recently(const struct handshake_words *words,
						      __u64 flow_hash, __u64 now)
{
	__u16 mark = *(volatile const __u16 *)&words->retry[handshake_retry_index(flow_hash)];

	return (mark & RETRY_MARKED) &&
	       ((__u32)(handshake_unit(now) - (mark & RETRY_UNIT_MASK)) & RETRY_UNIT_MASK) <
		       RETRY_MEMORY_UNITS;
}

// `HandshakeTable::on_syn`: the SYN of (flow_hash, client_isn) was given to `server`. If
// the same SYN was seen before, returns 1 and the server it was given then in `previous`,
// whose count the caller lowers.
static __always_inline int handshake_on_syn(struct handshake_words *words, __u64 flow_hash,
					    __u32 client_isn, __u32 server, __u64 now,
					    __u32 *previous)
{
	__u64 fingerprint = handshake_fingerprint(flow_hash, client_isn);
	__u64 entry = HANDSHAKE_VALID |
		      (((__u64)server & HANDSHAKE_HOLDER_MASK) << HANDSHAKE_HOLDER_SHIFT) |
		      fingerprint;
	__u64 old = __sync_lock_test_and_set(&words->slot[flow_hash & (HANDSHAKE_SLOTS - 1)],
					     entry);

	if (!(old & HANDSHAKE_VALID) || (old & 0xffffffff) != fingerprint)
		return 0;
	*(volatile __u16 *)&words->retry[handshake_retry_index(flow_hash)] =
		RETRY_MARKED | handshake_unit(now);
	*previous = (old >> HANDSHAKE_HOLDER_SHIFT) & HANDSHAKE_HOLDER_MASK;
	return 1;
}

// What `HandshakeTable::on_syn_ack` does for a SYN-ACK of `server` to a recently retried
// SYN, decided from one read of the slot (handshake_answer_decide) and written by one
// compare-and-swap of it (handshake_answer_commit).
// No pointer: it is kept in reply_scratch (maps.h), from which a pointer would read back
// as a number; the commit finds the slot again by its index.
struct handshake_answer {
	__u64 seen;    // the slot as read
	__u64 written; // what it becomes: answered, held by the server that answered
	__u32 index;   // the slot's, in handshakes
	// The server that held the count: it moves to the answering one if that is another.
	__u32 from;
};

static __always_inline int handshake_answer_moves(const struct handshake_answer *answer,
						  __u32 server)
{
	return answer->from != server;
}

// Whether the SYN-ACK is the first answer to its SYN and so updates the slot (and with
// `moved`, moves the count from `from`); 0: the core would leave the slot as it is.
static __always_inline int handshake_answer_decide(struct handshake_words *words,
						   __u64 flow_hash, __u32 client_isn,
						   __u32 server, struct handshake_answer *answer)
{
	__u64 fingerprint = handshake_fingerprint(flow_hash, client_isn);
	__u64 *slot = &words->slot[flow_hash & (HANDSHAKE_SLOTS - 1)];
	__u64 entry = *(volatile __u64 *)slot;
	__u32 holder = (entry >> HANDSHAKE_HOLDER_SHIFT) & HANDSHAKE_HOLDER_MASK;

	if (!(entry & HANDSHAKE_VALID) || (entry & 0xffffffff) != fingerprint ||
	    (entry & HANDSHAKE_ANSWERED))
		return 0;
	answer->index = flow_hash & (HANDSHAKE_SLOTS - 1);
	answer->seen = entry;
	answer->written = (entry & ~(HANDSHAKE_HOLDER_MASK << HANDSHAKE_HOLDER_SHIFT)) |
			  HANDSHAKE_ANSWERED |
			  (((__u64)server & HANDSHAKE_HOLDER_MASK) << HANDSHAKE_HOLDER_SHIFT);
	answer->from = holder;
	return 1;
}

// The slot changes only if no other writer changed it since it was read; 0 if one did
// (the caller hands the SYN-ACK up, nothing written, for the core to decide afresh).
static __always_inline int handshake_answer_commit(const struct handshake_answer *answer)
{
	__u32 zero = 0;
	struct handshake_words *words = bpf_map_lookup_elem(&handshakes, &zero);

	if (!words)
		return 0;
	return __sync_val_compare_and_swap(&words->slot[answer->index & (HANDSHAKE_SLOTS - 1)],
					   answer->seen, answer->written) == answer->seen;
}

#endif
