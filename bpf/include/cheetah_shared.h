// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Everything the XDP steering program (bpf/xdp_steer.c) and the userspace that loads it
// (crates/daemon/src/dataplane) must agree on: limits, the metadata in front of a steered
// packet, the counters, and the map keys userspace writes. The Rust side's copies are
// checked against this file by crates/daemon/src/dataplane/shared_layout_tests.rs, which
// compiles it for the host: so it includes nothing BPF-only.

#ifndef CHEETAH_SHARED_H
#define CHEETAH_SHARED_H

#include <linux/types.h>

// The xsks map has MAX_QUEUES keys per interface slot, and interface_slots MAX_INTERFACES
// entries.
#define MAX_QUEUES 64
#define MAX_INTERFACES 16
// Entries of host_addrs: the LB host's own IPv4 addresses.
#define MAX_HOST_ADDRS 256

// In front of each packet handed to a socket, as XDP metadata.
#define META_MAGIC 0xc4ee7a11
#define META_TO_VIP (1u << 0)
#define META_FROM_SERVER (1u << 1)
#define META_FIB_OK (1u << 2)
#define META_FIB_NO_NEIGH (1u << 3)
#define META_FIB_FAILED (1u << 4)

struct cheetah_meta {
	__u32 magic;
	__u32 flags;
	__u32 ifindex;
	__u8 dmac[6];
	__u8 smac[6];
};

// Indices of the per-CPU stats array.
enum xdp_stat {
	STAT_TO_SOCKET,
	STAT_NO_SOCKET,
	STAT_PASSED,
	STAT_NO_METADATA_ROOM,
	STAT_COUNT,
};

// Key of the backends map.
struct backend_key {
	__u32 addr; // network byte order
	__u16 port; // network byte order
	__u16 pad;
};

#endif
