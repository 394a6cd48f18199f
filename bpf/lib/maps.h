// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Every map of the LB's XDP program. Userspace (crates/daemon/src/dataplane) writes all
// but stats and server_traffic, which it reads (and seeds policy_state and policy_rng,
// shares handshakes, msb_seen and msb_restores); the layouts of keys and values are in
// cheetah_shared.h, mirrored in Rust and checked by shared_layout_tests.rs.

#ifndef CHEETAH_LIB_MAPS_H
#define CHEETAH_LIB_MAPS_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "cookie.h"

// Key: interface slot * MAX_QUEUES + rx queue. A socket only accepts frames from the
// device and queue it is bound to, so each interface needs its own range of keys.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_INTERFACES * MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// ifindex -> interface slot.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, __u32);
} interface_slots SEC(".maps");

// The maps userspace publishes the tables into hold two copies of them, by key
// (publish.h): arrays twice their entries, hash maps the copy in their keys.

// VIP addresses (network byte order) -> unused.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, struct vip_addr_key);
	__type(value, __u32);
} vip_addrs SEC(".maps");

// NAT backends (DIP, port) -> which server and VIP they are. Empty in l2 forwarding.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PUBLISH_COPIES * 65536);
	__type(key, struct backend_key);
	__type(value, struct backend_info);
} backends SEC(".maps");

// The LB host's own IPv4 addresses (network byte order) -> unused, filled by userspace
// from the host's interfaces (VIP addresses left out).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_HOST_ADDRS);
	__type(key, __u32);
	__type(value, __u32);
} host_addrs SEC(".maps");

// enum xdp_stat -> packets, per CPU.
_Static_assert(STAT_COUNT <= STAT_SLOTS, "enum xdp_stat outgrew the stats map");
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

// The in-kernel path's switch and the tables' mode, forwarding and cookie layout, one
// entry per copy of the tables (publish.h). All zero (as loaded) is the fast path off:
// the program only steers. Mmapable, so that the publisher can move publish_seq (entry 0)
// with atomic stores.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct lb_config);
} lb_config SEC(".maps");

// The TCP VIPs by (address, port, 6).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, struct vip_key);
	__type(value, struct vip_info);
} vips SEC(".maps");

// The TCP VIP at (`addr`, `port`) in publication copy `copy`, or NULL.
static __always_inline struct vip_info *tcp_vip_at(__u32 copy, __be32 addr, __be16 port)
{
	struct vip_key key = {};

	key.addr = addr;
	key.port = port;
	key.protocol = IPPROTO_TCP;
	key.copy = copy;
	return bpf_map_lookup_elem(&vips, &key);
}

// The same VIPs by their index in the tables snapshot (NAT replies name theirs by index).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_info);
} vips_by_index SEC(".maps");

// The VIPs again, each at the slot its (address, port) hashes to (cheetah_shared.h struct
// vip_slot): a client's established segment finds its VIP by an array read, not a hash
// lookup.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES * VIP_SLOTS);
	__type(key, __u32);
	__type(value, struct vip_slot);
} vip_slots SEC(".maps");

// Server id -> its state and where its packets go.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES * SERVER_ID_SPACE);
	__type(key, __u32);
	__type(value, struct server_info);
} servers SEC(".maps");

// l2 replies: a server's MAC -> its id.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PUBLISH_COPIES * SERVER_ID_SPACE);
	__type(key, struct mac_key);
	__type(value, __u32);
} server_macs SEC(".maps");

// A server's reply -> its sender, direct-mapped (cheetah_shared.h struct reply_slot): one
// array read, where a hash map lookup costs a hash and a bucket walk.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES * REPLY_SLOTS);
	__type(key, __u32);
	__type(value, struct reply_slot);
} reply_senders SEC(".maps");

// ifindex % SERVER_SIDE_SLOTS -> that ifindex when the interface faces the servers, the only
// side replies are taken from (0: none). An array, so the reply path's test is an inlined
// read rather than a hash lookup; the ifindex stored says which interface owns the slot.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES * SERVER_SIDE_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} server_side SEC(".maps");

// The clock table's words the kernel reads (cheetah_shared.h), mmapped by userspace so that
// the core's MsbTable and the kernel share one table. Each map is ONE entry holding every
// word: an array map spaces its entries 8 bytes apart (elem_size is rounded up to 8), so
// an array of SERVER_ID_SPACE __u32 entries would not be the contiguous words the core's
// table indexes (struct msb_seen_words and msb_restore_words, cookie.h).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct msb_seen_words);
} msb_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct msb_restore_words);
} msb_restores SEC(".maps");

// The clock words learning writes (struct msb_clock_words), mmapped by userspace for the
// core's MsbTable (`ClockWords`): a reply whose MSB moved is learnt by either side.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct msb_clock_words);
} msb_clock SEC(".maps");

// The close filter's words (struct close_words), mmapped by userspace for the core's
// CloseFilter (`CloseFilter::with_words`): a close counted by either side is a duplicate
// for the other. One entry holding every word, as msb_seen.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct close_words);
} closes SEC(".maps");

// The fallback table's sets (cheetah_shared.h struct fallback_set), mmapped by userspace so
// that the core's FallbackTable and the kernel share one table. Sized at load time to the
// config's fallback_table_capacity / FALLBACK_WAYS (rounded up to a power of two); the
// one entry here only makes the object loadable as it is.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct fallback_set);
} fallback SEC(".maps");

// Server id -> what the in-kernel path sent to or received from it, per CPU.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SERVER_ID_SPACE);
	__type(key, __u32);
	__type(value, struct server_traffic);
} server_traffic SEC(".maps");

// VIP index -> the weights of its pool positions (wrr VIPs only; cheetah_shared.h).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_weights);
} vip_weights SEC(".maps");

// VIP index (of a copy, as an array's: publish.h latched_index) -> its pool, for the VIPs
// whose pool vip_info cannot hold (cheetah_shared.h struct vip_big_pool). Written at a
// publication; without preallocation only those VIPs take memory (32 KiB each).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_big_pool);
} vip_big_pools SEC(".maps");

// VIP index (of a copy, as an array's: publish.h latched_index) -> the cycle of its wrr
// weights, for the wrr VIPs the kernel reads one for (cheetah_shared.h struct
// vip_schedule: its length and first SCHEDULE_CAP entries; the others scan vip_weights).
// Written at a publication. A hash map without preallocation holds only the VIPs that
// have one (32 KiB each): an array, or a preallocated hash map, would take 256 MiB for
// both copies of MAX_VIPS.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_schedule);
} wrr_schedules SEC(".maps");

// The chunks of wrr cycles over SCHEDULE_CAP entries (cheetah_shared.h struct
// schedule_chunk), written at a publication with the cycle's first entries. Room for one
// budget more than the copies hold: the publisher writes a copy's new chunks before it
// deletes its stale ones (xdp_tables.rs `sync`), and their keys need not be the same.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, (PUBLISH_COPIES + 1) * SCHEDULE_CHUNK_BUDGET);
	__type(key, struct schedule_chunk_key);
	__type(value, struct schedule_chunk);
} wrr_schedule_chunks SEC(".maps");

// VIP index -> the cycle of its awrr buckets, replaced by userspace at every fold that
// changes them, outside the publish window: an update of a hash map without
// preallocation links a whole new element in and frees the old one after an RCU grace
// period, so a reader sees the old cycle or the new, never a mix. Only the kernel's awrr
// VIPs take memory (32 KiB each; preallocated, MAX_VIPS entries would take 128 MiB).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_schedule);
} awrr_schedules SEC(".maps");

// VIP index -> this CPU's rr cursor and wrr credits for it, seeded by userspace. Per CPU:
// every SYN advances it, and a shared cursor would bounce its cache line between CPUs.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct policy_state);
} policy_state SEC(".maps");

// CPU -> that CPU's view of every server's active connections for pow2 and least loaded
// (cheetah_shared.h struct active_row): bases published by userspace at every fold, own
// counts by the CPU's program. Per CPU by key, not a per-CPU array, so that a row is one
// contiguous value userspace maps; sized at load to the possible CPUs (xdp.rs
// size_load_rows; 1 here only until then).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct active_row);
} active_rows SEC(".maps");

// LOAD_METRIC_* -> every server's published load under it (cheetah_shared.h struct
// published_row), written by userspace at every fold through a mapping.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LOAD_METRICS);
	__type(key, __u32);
	__type(value, struct published_row);
} published_loads SEC(".maps");

// One word userspace adds 1 to after every change it makes to the loads a pick reads (a
// fold's bases in active_rows, the published_loads): what least_loaded.h's caches were
// computed under. Mapped by userspace (xdp.rs load_generation).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} load_generation SEC(".maps");

// The kernel's alone, not pinned (pin.rs, `*_cache`: the caches it serves start empty with
// the program). This CPU's last LOAD_CHANGES changes of its own active counts
// (load_view.h add_own_active), by server id: what least_loaded.h's caches have to catch
// up with.
#define LOAD_CHANGES 8
struct load_changes {
	__u32 seq;               // changes logged, wrapping; the next goes to id[seq % LOAD_CHANGES]
	__u16 id[LOAD_CHANGES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct load_changes);
} load_changes_cache SEC(".maps");

// The kernel's alone, not pinned (`*_cache`). Per CPU and direct-mapped by VIP index: what
// least loaded needs of a pool of at most LEAST_CACHE_POSITIONS servers to pick in O(1)
// instead of scanning it (least_loaded.h): the least load, the positions at it and at one
// more, each set a bit per position in LEAST_SET_WORDS words under a summary word.
#define LEAST_CACHE_SLOTS 16
#define LEAST_SET_WORDS 64
#define LEAST_CACHE_POSITIONS (LEAST_SET_WORDS * 64)
struct least_cached {
	__u64 min;             // the pool's least load, as view_load gives it
	__u64 generation;      // load_generation's word when the slot was filled
	__u32 vip;             // VIP index + 1 of the slot's pool (0: none)
	__u32 seq;             // the publish_seq the pool was read under
	__u32 changes_seen;    // load_changes.seq caught up with
	__u32 above_complete;  // the min + 1 set holds every such position, not a subset
	__u32 at;              // which of sets holds the positions at min; the other, min + 1
	__u32 pad;
	// Bit w of summary[s]: word w of sets[s] holds positions. A word whose bit is clear is
	// stale and reads as empty, so that emptying a set is one store, whatever its size.
	__u64 summary[2];
	__u64 sets[2][LEAST_SET_WORDS]; // bit p % 64 of word p / 64: pool position p
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LEAST_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct least_cached);
} least_loaded_cache SEC(".maps");

// The kernel's alone, not pinned (`*_cache`); the slot of least_loaded_cache's beside it:
// server id -> its position in the slot's pool as the last fill wrote it; a stale entry is
// told by the pool's member at that position. A map of its own: with the sets, a slot
// would pass the 32 KiB a per-CPU value may hold.
struct least_positions {
	__u16 position_of[SERVER_ID_SPACE];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LEAST_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct least_positions);
} least_positions_cache SEC(".maps");

// This CPU's random generator for the random policy, seeded by userspace.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct policy_rng);
} policy_rng SEC(".maps");

// The core's HandshakeTable, mmapped by userspace (cheetah_shared.h struct
// handshake_words): one entry holding every word, as msb_seen.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct handshake_words);
} handshakes SEC(".maps");

// VIP index (of a copy, as an array's: publish.h latched_index) -> its pool's Maglev
// table (cheetah_shared.h struct maglev_chunk), an inner array the publisher makes once
// per VIP and copy at the config's size and rewrites in place through a mapping (while
// packets read the other copy) when the table changes. BPF_F_INNER_MAP:
// the inner arrays' size is the config's, not this template's (the verifier then calls
// the lookup rather than inlining it). A VIP without
// a table (an empty pool, or not published yet) has no entry. Sizes, not types: clang
// leaves a struct reached only through the template's pointers without its size in BTF.
struct maglev_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct maglev_chunk));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, PUBLISH_COPIES * MAX_VIPS);
	__type(key, __u32);
	__array(values, struct maglev_table);
} maglev_tables SEC(".maps");

// IPv4 prefix -> the next hop toward a client there (cheetah_shared.h struct next_hop):
// the kernel's FIB and neighbour answers, mirrored by userspace so that a server's reply
// costs one trie lookup instead of bpf_fib_lookup.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, PUBLISH_COPIES * MAX_NEXT_HOPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct next_hop_key);
	__type(value, struct next_hop);
} next_hops SEC(".maps");

// Destination address (network byte order) -> its next hop, for the hosts of on-link
// routes (a NEXT_HOP_ON_LINK entry of next_hops) whose neighbour entry is usable: one /32
// each would make the trie deep around them, and a trie lookup costs with its depth.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PUBLISH_COPIES * MAX_NEXT_HOPS);
	__type(key, struct next_hop_host_key);
	__type(value, struct next_hop);
} next_hop_hosts SEC(".maps");

// The FIB lookup's parameters for a reply whose next hop the maps do not know
// (next_hop.h): 64 bytes the program's 512-byte stack frame cannot spare on the reply
// path. One packet's work, nothing kept: not pinned (pin.rs, `*_scratch`).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_fib_lookup);
} fib_scratch SEC(".maps");

// What the program lifts off a frame while the LB decides: its VLAN tags (vlan.h), its IP
// options and the headers that move over them (ip_options.h). Here rather than on the
// stack, which the LB's frame needs (crates/daemon/tests/xdp_program_loads.rs counts it).
// One packet's work, nothing kept: not pinned (pin.rs, `*_scratch`).
struct lift_scratch {
	__u32 tags[2];
	__u8 head[14 + 20];
	__u8 options[40];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lift_scratch);
} lift_scratch SEC(".maps");

// This CPU's lift_scratch slot.
static __always_inline struct lift_scratch *lift_slot(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&lift_scratch, &zero);
}

// The client addresses' answers of the two maps above, per CPU and direct-mapped: a reply
// toward a recent client reads one slot instead of walking the trie. The kernel's alone
// (userspace never reads it, so it is not in cheetah_shared.h), and not pinned
// (dataplane/pin.rs): its slots are tagged with a publish_seq, which a restart over a
// fresh lb_config would count again from 0.
//
// A slot holds a NEXT_HOP_KNOWN answer of next_hops / next_hop_hosts for one client
// address, valid while lb_config.publish_seq is still `seq` (the copy read under `seq` is
// rewritten only after the word moved on: publish.h). The slot of an address is a multiplicative
// hash of it to NEXT_HOP_CACHE_BITS bits.
#define NEXT_HOP_CACHE_BITS 12
#define NEXT_HOP_CACHE_SLOTS (1 << NEXT_HOP_CACHE_BITS)
#define NEXT_HOP_CACHE_MULTIPLIER 0x9e3779b1u
struct next_hop_cached {
	__u32 addr; // network byte order
	__u32 seq;  // the publish_seq the answer was read under
	struct next_hop hop;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NEXT_HOP_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct next_hop_cached);
} next_hop_cache SEC(".maps");

#endif
