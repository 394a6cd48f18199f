// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The reader's half of the publisher's latch (Linux's raw_write_seqcount_latch): how a
// packet never acts on half a change of the tables, and never waits for one
// (crates/daemon/src/dataplane/publish_window.rs is the writer's half).
//
// Userspace changes the maps entry by entry: an array value is copied in place, and a
// preallocated hash map may reuse an element a program still reads. One API call (a pool
// change, a server moved) touches several entries and maps. So every table the program
// reads on its straight lines is there twice, copy 0 and copy 1 (an array holds twice its
// entries, copy c's at c * entries + index; a hash key and the next-hop trie's key carry
// the copy; lb_config has one entry per copy, each naming its `copy`), and the parity of
// lb_config.publish_seq (entry 0) says which copy packets read. The writer only ever
// writes the copy packets are not told to read: it applies a change to that copy, moves
// the word on by one (packets now read the copy just written), then applies the same
// change to the other one. Every straight line is shaped decide, then commit: it reads the
// word first (publish_begin), reads every published map it needs from that copy into
// locals, and checks the word again (publish_unchanged) before its first write to the
// packet or to any map. Only a packet whose reads straddle a flip, which may have read
// its copy while the writer began rewriting it, is handed up unchanged
// (STAT_UP_PUBLISHING); a packet that arrives while a publication is written reads the
// other, whole copy and is forwarded in the kernel.
//
// Ordering: the loads below are plain loads kept in program order by the compiler
// barriers; x86-64 does not reorder loads with loads, and the writer's stores reach
// memory in program order (its sequence stores are atomic, the map writes are system
// calls between them). A weakly ordered CPU would need load-acquire here.

#ifndef CHEETAH_LIB_PUBLISH_H
#define CHEETAH_LIB_PUBLISH_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"

#define publish_barrier() asm volatile("" ::: "memory")

// The sequence word (`entry0`: lb_config's entry 0) before any table is read.
static __always_inline __u32 publish_begin(const struct lb_config *entry0)
{
	__u32 seq = *(volatile const __u32 *)&entry0->publish_seq;

	publish_barrier();
	return seq;
}

// The copy of the tables a packet that began at `seq` reads (and lb_config's entry of it).
static __always_inline __u32 publish_copy(__u32 seq)
{
	return seq & 1;
}

// Whether every table read since publish_begin returned `seq` is of one publication: the
// word has not moved, so the writer has not begun to rewrite the copy read.
static __always_inline int publish_unchanged(__u32 seq)
{
	__u32 zero = 0;
	const struct lb_config *entry0;

	publish_barrier();
	entry0 = bpf_map_lookup_elem(&lb_config, &zero);
	return entry0 && *(volatile const __u32 *)&entry0->publish_seq == seq;
}

// The key of entry `index` of copy `copy` of a published array of `entries` per copy;
// past both copies (no entry) for an index beyond one copy, which must not read the other.
static __always_inline __u32 latched_index(__u32 copy, __u32 index, __u32 entries)
{
	return index < entries ? copy * entries + index : PUBLISH_COPIES * entries;
}

#endif
