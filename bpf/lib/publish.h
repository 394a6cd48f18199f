// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The reader's half of the publisher's seqlock: how a packet never acts on half a change
// of the tables (crates/daemon/src/dataplane/publish_window.rs is the writer's half).
//
// Userspace changes the maps entry by entry: an array value is copied in place, and a
// preallocated hash map may reuse an element a program still reads. One API call (a pool
// change, a server moved) touches several entries and maps. So the publisher makes
// lb_config.publish_seq odd before its first write and even again after its last, and
// every straight line is shaped decide, then commit: it reads the sequence word first
// (publish_begin), reads every published map it needs into locals, and checks the word
// again (publish_unchanged) before its first write to the packet or to any map. A packet
// that raced a publication is handed up unchanged (STAT_UP_PUBLISHING); the AF_XDP
// workers then decide on one whole snapshot of the core's tables.
//
// Ordering: the loads below are plain loads kept in program order by the compiler
// barriers; x86-64 does not reorder loads with loads, and the writer's stores reach
// memory in program order (its sequence stores are atomic, the map writes are system
// calls between them). A weakly ordered CPU would need load-acquire here.

#ifndef CHEETAH_LIB_PUBLISH_H
#define CHEETAH_LIB_PUBLISH_H

#include "cheetah_shared.h"

#define publish_barrier() asm volatile("" ::: "memory")

// The sequence word before any table is read.
static __always_inline __u32 publish_begin(const struct lb_config *config)
{
	__u32 seq = *(volatile const __u32 *)&config->publish_seq;

	publish_barrier();
	return seq;
}

// Whether every table read since publish_begin returned `seq` belongs to one publication:
// no write was in progress then (even) and none began since (unchanged).
static __always_inline int publish_unchanged(const struct lb_config *config, __u32 seq)
{
	publish_barrier();
	return !(seq & 1) && *(volatile const __u32 *)&config->publish_seq == seq;
}

#endif
