// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Everything the XDP program (bpf/xdp_lb.c and the library under bpf/lib/) and the
// userspace that loads it (crates/daemon/src/dataplane) must agree on: limits, the
// metadata in front of a packet handed to a socket, the counters, and the keys and values
// of the maps userspace writes. The Rust side's copies are
// checked against this file by crates/daemon/src/dataplane/shared_layout_tests.rs, which
// compiles it for the host: so it includes nothing BPF-only.

#ifndef CHEETAH_SHARED_H
#define CHEETAH_SHARED_H

#include <linux/types.h>

// The layout of the pinned maps' contents (docs/dataplane.md "Pinned maps"): bump it when
// any key or value below changes, or what a map's words mean does, so that `cheetah run`
// starts fresh maps instead of reading an earlier build's pinned ones half-compatibly. A
// change of a map's type, key or value size, entries or flags alone is caught anyway.
#define CHEETAH_PIN_LAYOUT 4

// Copies of every published table (bpf/lib/publish.h): the latch's two.
#define PUBLISH_COPIES 2

// The xsks map has MAX_QUEUES keys per interface slot, and interface_slots MAX_INTERFACES
// entries.
#define MAX_QUEUES 64
#define MAX_INTERFACES 16
// Entries of server_side: the interface with ifindex i is recorded at i % SERVER_SIDE_SLOTS
// (a power of two).
#define SERVER_SIDE_SLOTS 1024
// Entries of host_addrs: the LB host's own IPv4 addresses.
#define MAX_HOST_ADDRS 256

// In front of each packet handed to a socket, as its first bytes (steer.h `write_meta`).
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
	STAT_NO_METADATA_ROOM,  // also: no room to lift a tagged frame's tags or put them back (vlan.h)
	// Packets the in-kernel path handled, one per core `Bundle` (lb/counters.rs): each
	// stands for every counter of its bundle, so metrics add them under the core's names.
	STAT_FAST_CLIENT_COOKIE,
	STAT_FAST_CLIENT_PICK,
	STAT_FAST_SERVER_COOKIE,
	STAT_FAST_SERVER_PLAIN,
	// Why the in-kernel path handed a packet it looked at to userspace (the core then
	// decides and counts it): one reason per packet.
	STAT_UP_NEW_CONNECTION, // a client SYN the kernel does not place: the VIP's policy runs in userspace
	STAT_UP_LAYOUT,         // a layout the kernel could not read (defensive: the options' walk did not run)
	STAT_UP_COOKIE,         // a cookie whose maps the kernel could not read (defensive: never seen)
	STAT_UP_CLOCK,          // a sample of the replies whose clock the core would not learn (one a second per CPU, for its warning), or a reply that raced another writer
	STAT_UP_HANDSHAKE_OR_CLOSE, // a SYN-ACK with FIN or RST, or a retried SYN's first answer that also learns a clock, has no timestamp, or raced
	STAT_UP_NEXT_HOP,       // no next hop in the kernel (FIB miss, no neighbour, server egress unknown)
	STAT_UP_OTHER,          // anything else: unknown VIP port (over 4,096 VIPs), pool not published
	// A reply the in-kernel path looked up in next_hops without a usable answer: it asked
	// bpf_fib_lookup instead (whatever the FIB then said).
	STAT_NEXT_HOP_MISS,
	// The tables changed while the packet was being decided (lb_config.publish_seq): the
	// kernel never acts on half a publication, userspace decides on a whole snapshot.
	STAT_UP_PUBLISHING,
	// Client SYNs the in-kernel path placed by the VIP's policy (core Bundle::ClientSyn),
	// and those among them that retransmitted a SYN seen before, whose earlier pick's count
	// was released (Bundle::ClientSynRetransmitted): one of the two per SYN.
	STAT_FAST_CLIENT_SYN,
	STAT_FAST_CLIENT_SYN_RETRANSMITTED,
	// A server's FIN, or RST with a timestamp, handled in the kernel (lb/closes.rs): the
	// core's ServerCookie bundle plus its `server_closes` (the first close of its
	// connection: server_traffic.closed went up) or `duplicate_closes` (already counted).
	STAT_FAST_SERVER_CLOSE,
	STAT_FAST_SERVER_DUPLICATE_CLOSE,
	// An ICMP error routed in the kernel by the cookie it quotes (lb/icmp_path.rs): the
	// core's `icmp_routed_by_cookie` and `to_server`.
	STAT_FAST_ICMP_COOKIE,
	// An ICMP error routed in the kernel by a baseline's pick (hash or maglev mode): the
	// core's `to_server`.
	STAT_FAST_ICMP_PICK,
	// An ICMP error to a VIP whose quote has no cookie where the kernel looks (NOP NOP TS
	// after a whole TCP header): userspace routes it by the fallback table or copies it to
	// every server of the VIP.
	STAT_UP_ICMP,
	// A client segment without TCP options routed by the shared fallback table (core
	// Bundle::ClientFallback).
	STAT_FAST_CLIENT_FALLBACK,
	// A client segment without TCP options that the fallback table does not know: the
	// core sends it where the VIP's Maglev table points.
	STAT_UP_FALLBACK_MISS,
	// A reply whose MSB moved, learnt in the kernel (bpf/lib/clock_learn.h): what the
	// packet's entry without the move stands for (STAT_FAST_SERVER_COOKIE, _CLOSE or
	// _DUPLICATE_CLOSE) plus the core's `ts_msb_learned` (the server's first MSB) or
	// `ts_msb_advanced`. Each LEARNED entry is followed by its ADVANCED one.
	STAT_FAST_SERVER_COOKIE_LEARNED,
	STAT_FAST_SERVER_COOKIE_ADVANCED,
	STAT_FAST_SERVER_CLOSE_LEARNED,
	STAT_FAST_SERVER_CLOSE_ADVANCED,
	STAT_FAST_SERVER_DUPLICATE_CLOSE_LEARNED,
	STAT_FAST_SERVER_DUPLICATE_CLOSE_ADVANCED,
	// A segment steering called a server's reply with the in-kernel path on: one the
	// reply_senders map did not know (reply_sender.h), whatever then became of it.
	STAT_REPLY_BY_STEERING,
	// maglev (stage 3). A client SYN without TCP options (cheetah mode) placed by the VIP's
	// Maglev table and remembered in the fallback table: the core's OptionsSlowPath,
	// FallbackConnections and ToServer, plus FallbackEvictions when the insert evicted a
	// flow and SynRetransmissions when the handshake table knew the SYN (one of the four
	// per SYN).
	STAT_FAST_FALLBACK_SYN,
	STAT_FAST_FALLBACK_SYN_EVICTED,
	STAT_FAST_FALLBACK_SYN_RETRANSMITTED,
	STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED,
	// A client segment without TCP options the fallback table does not know, forwarded by
	// the VIP's Maglev table: the core's OptionsSlowPath, FallbackMisses and ToServer.
	STAT_FAST_FALLBACK_MISS,
	// A server's SYN-ACK whose options hold no timestamp, which taught the fallback table
	// its server (the core's server_path.rs): FastPath, OptionsSlowPath,
	// FallbackLearnedFromServer and ToClient, plus FallbackEvictions when the insert evicted
	// a flow.
	STAT_FAST_SERVER_FALLBACK_LEARNED,
	STAT_FAST_SERVER_FALLBACK_LEARNED_EVICTED,
	// loads (stage 4). Retired: what programs before STAT_ANSWER_MOVED counted for a
	// SYN-ACK with a timestamp that moved its retried SYN's load count (STAT_FAST_SERVER_
	// COOKIE's counters plus HandshakeCountMoved). Never counted now; kept so that the
	// counts a pinned stats map holds from an older program keep their meaning.
	STAT_FAST_SERVER_COOKIE_MOVED_RETIRED,
	// hop (stage 4). A reply whose next hop the per-CPU next_hop_cache did not hold for the
	// current publication: it read next_hops (and, on a miss there, asked the FIB).
	STAT_NEXT_HOP_CACHE_MISS,
	// layout. A client's established segment whose timestamp option the options' walk
	// found, not NOP NOP TS (parse.h timestamp_walk), or a client's SYN-ACK (its
	// timestamp found by the compare too: STAT_OPTIONS_COMPARED beside it), routed by its
	// cookie as the core's general path routes it: OptionsSlowPath, CookieRouted and
	// ToServer.
	STAT_FAST_CLIENT_COOKIE_WALKED,
	// layout. Counted beside the entry of a reply, SYN-ACK or client SYN whose timestamp
	// the walk found where no wide compare looks: the core counted OptionsSlowPath where
	// that entry stands for OptionsFastPath (metrics move one from the first to the second).
	STAT_OPTIONS_WALKED,
	// layout. A baseline's client segment whose TCP header is too short for the straight
	// line (20, 24 or 28 bytes), forwarded by its pick as the core's general path forwards
	// it: ToServer only.
	STAT_FAST_CLIENT_PICK_GENERAL,
	// layout. A server's segment in cheetah mode (not a SYN, not a FIN) whose options hold
	// no timestamp, forwarded as the core's server path forwards it (no cookie, NAT
	// undone): FastPath, OptionsSlowPath and ToClient; with RST, ResetsWithoutTimestamp too
	// (never a close: closes.rs `on_server_close`).
	STAT_FAST_SERVER_NO_TIMESTAMP,
	STAT_FAST_SERVER_RESET_NO_TIMESTAMP,
	// layout. The same two with a TCP header too short for the straight line (20, 24 or 28
	// bytes: Linux's RST for a segment it does not know has none): the core's general path
	// takes them, which counts no FastPath.
	STAT_FAST_SERVER_NO_TIMESTAMP_GENERAL,
	STAT_FAST_SERVER_RESET_NO_TIMESTAMP_GENERAL,
	// layout. A baseline's server segment whose TCP header is too short for the straight
	// line, forwarded as the core's general path forwards it: ToClient only.
	STAT_FAST_SERVER_PLAIN_GENERAL,
	// drops. A client's segment to a cheetah-mode VIP whose TCP options the core drops,
	// or a server's reply whose TCP header is too short for the straight line (the core's
	// general path counts nothing first either), dropped in the kernel (XDP_DROP): the
	// core's `dropped` and its drops_by_reason entry of the same name. In the order of the
	// walk's codes (parse.h TIMESTAMP_OPTION_TRUNCATED ... TIMESTAMP_BAD_LENGTH).
	STAT_DROP_TCP_OPTION_TRUNCATED,
	STAT_DROP_TCP_OPTION_BAD_LENGTH,
	STAT_DROP_TCP_OPTION_OVERRUN,
	STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH,
	// The same for a server's reply, for which the core also counted its server path's
	// `fast_path` first.
	STAT_DROP_SERVER_TCP_OPTION_TRUNCATED,
	STAT_DROP_SERVER_TCP_OPTION_BAD_LENGTH,
	STAT_DROP_SERVER_TCP_OPTION_OVERRUN,
	STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH,
	// An IPv4 fragment to a VIP address (untagged, its IP header as the core checks it),
	// dropped in the kernel: the core's `dropped` and `unsupported_fragment`.
	STAT_DROP_UNSUPPORTED_FRAGMENT,
	// Traffic to a VIP address that is no VIP's, dropped in the kernel as the core drops
	// it (untagged, its IP header as the core checks it, no fragment): UDP, an IP protocol
	// other than TCP, UDP and ICMP, and (LB_EVERY_VIP) a TCP segment to a port no VIP is
	// on. The core's `dropped` and its reason of the same name.
	STAT_DROP_UNSUPPORTED_UDP,
	STAT_DROP_UNSUPPORTED_PROTOCOL,
	STAT_DROP_VIP_PORT_UNKNOWN,
	// l2: a TCP segment from a VIP address on the servers' side: from a server the
	// snapshot keeps but no longer forwards for (`server_removed`), or from a MAC no
	// server has (`unknown_server_source`). The core's `dropped` and that reason; for a
	// removed server's segment of the straight line's layout, its `fast_path` first.
	STAT_DROP_SERVER_REMOVED,
	STAT_DROP_UNKNOWN_SERVER_SOURCE,
	// A removed server's segment whose TCP header is too short for the straight line, and
	// (nat) any late reply of a removed server: the core's general path, which counts no
	// `fast_path`.
	STAT_DROP_SERVER_REMOVED_GENERAL,
	// fin. A server's FIN without a timestamp option (cheetah mode), its close filed as a
	// stamped one's (lb/closes.rs `on_server_close`): FastPath, OptionsSlowPath and
	// ToClient, plus `server_closes` (the first close of its connection:
	// server_traffic.closed went up) or `duplicate_closes`.
	STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE,
	STAT_FAST_SERVER_NO_TIMESTAMP_DUPLICATE_CLOSE,
	// fin. Counted beside the entry of a segment the core's general path took, which counts
	// no FastPath, where that entry stands for the straight line's FastPath (metrics take
	// one off): a server segment whose TCP header is too short for the straight line (20,
	// 24 or 28 bytes: a FIN without options, a SYN-ACK with only MSS;
	// STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE, _DUPLICATE_CLOSE,
	// STAT_FAST_SERVER_FALLBACK_LEARNED, _EVICTED), and a client segment whose walked
	// timestamp's cookie routes nowhere (STAT_DROP_COOKIE_*, STAT_DROP_TS_MSB_UNKNOWN). One
	// entry, not a _GENERAL twin of each.
	STAT_GENERAL_PATH,
	// A server's reply (l2: from a server's MAC and a VIP's address and port; nat: from a
	// current backend) that arrived on an interface facing the clients: forged, dropped
	// in the kernel as the core drops it (`dropped`, `reply_from_client_side`).
	STAT_DROP_REPLY_FROM_CLIENT_SIDE,
	// cheetah mode: a client's segment whose cookie routes nowhere, dropped in the kernel
	// as the core's cookie stage drops it (FastPath, OptionsFastPath, `dropped` and the
	// reason: `cookie_unknown_server`, `cookie_server_removed`, `ts_msb_unknown`; a walked
	// timestamp, which the core's general path took, also counts STAT_OPTIONS_WALKED and
	// STAT_GENERAL_PATH). A forged-cookie flood stays in the kernel.
	STAT_DROP_COOKIE_UNKNOWN_SERVER,
	STAT_DROP_COOKIE_SERVER_REMOVED,
	STAT_DROP_TS_MSB_UNKNOWN,
	// cheetah mode: an ICMP error whose quoted cookie names an id no server has or a
	// removed server, dropped in the kernel as the core's ICMP path drops it (`dropped`
	// and the reason, nothing before). A forged-quote flood stays in the kernel too.
	STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER,
	STAT_DROP_ICMP_COOKIE_SERVER_REMOVED,
	// An echo (a client segment's TSecr, an ICMP error's quoted TSval) restored in the
	// kernel more than 2^(k-1) periods behind its server's newest MSB, counted beside the
	// packet's entry: the core's `echoes_beyond_idle_limit` (MsbTable::restore_unmasked),
	// which the metric adds it to. A connection idle past the layout's limit wakes up in
	// the kernel.
	STAT_ECHO_BEYOND_IDLE_LIMIT,
	// A packet steering gave the LB whose IPv4 header the core's `Ipv4Packet::new_checked`
	// refuses (`bad_ip_version`, `bad_ipv4_header_length`, `bad_ipv4_total_length`), and a
	// TCP segment to a VIP address whose header its `TcpSegment::new_checked` refuses
	// (`truncated_tcp`, `bad_tcp_data_offset`): dropped in the kernel, as the core drops
	// them, counting only the drop. In parse.h's order (ipv4_fault, tcp_fault).
	STAT_DROP_BAD_IP_VERSION,
	STAT_DROP_BAD_IPV4_HEADER_LENGTH,
	STAT_DROP_BAD_IPV4_TOTAL_LENGTH,
	STAT_DROP_TRUNCATED_TCP,
	STAT_DROP_BAD_TCP_DATA_OFFSET,
	// cheetah mode: a client segment without a timestamp whose fallback entry names a
	// server that no longer forwards, dropped and its entry removed in the kernel, as the
	// core's client_path.rs does (`options_slow_path`, then the drop).
	STAT_DROP_FALLBACK_SERVER_REMOVED,
	// A reply whose clock the core would not learn (clock_learn.h), forwarded in the
	// kernel when this CPU handed such a reply up less than a second ago (it goes up as a
	// sample, STAT_UP_CLOCK, for the workers to log): what the packet's entry without the
	// clock stands for (STAT_FAST_SERVER_COOKIE, _CLOSE or _DUPLICATE_CLOSE) plus the
	// core's `server_ts_clock_unstable` (backwards, or ticking too fast: learnt first, as
	// the core learns it) or `server_ts_ahead_of_real_time` (nothing learnt). Each UNSTABLE
	// entry is followed by its AHEAD one.
	STAT_FAST_SERVER_COOKIE_UNSTABLE,
	STAT_FAST_SERVER_COOKIE_AHEAD,
	STAT_FAST_SERVER_CLOSE_UNSTABLE,
	STAT_FAST_SERVER_CLOSE_AHEAD,
	STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE,
	STAT_FAST_SERVER_DUPLICATE_CLOSE_AHEAD,
	// An ICMP message to a VIP address that the core's ICMP path refuses before it looks
	// for a VIP (icmp_path.rs `Embedded::parse`, `client_icmp`): shorter than its header
	// or than a quoted IPv4 header and 8 bytes (`truncated_icmp`), not an error (an echo
	// request: a ping of a VIP), quoting no TCP segment or one not from that VIP address
	// (`unsupported_icmp_type`). Dropped in the kernel, counting only the drop, so a ping
	// flood at a VIP stays in the kernel.
	STAT_DROP_TRUNCATED_ICMP,
	STAT_DROP_UNSUPPORTED_ICMP_TYPE,
	// l2: a packet from a VIP address that is no TCP segment, from a server's MAC (a
	// server's ICMP error to its client, say), forwarded to the client as it came
	// (reply_sender.h not_tcp_from_vip_l2): the core's `to_client` only.
	STAT_FAST_SERVER_NOT_TCP,
	// Cheetah mode: an ICMP error whose quote carries no cookie (a client without
	// timestamps), routed to the server the fallback table remembers for the quoted
	// connection (icmp_path.h): the core's `icmp_routed_by_fallback` and `to_server`.
	STAT_FAST_ICMP_FALLBACK,
	// Counted beside a SYN-ACK's own STAT_FAST_* entry when it answered a retried SYN
	// first and moved the connection's load count to its server from the one holding it
	// (handshakes.h handshake_answer): the core's HandshakeCountMoved. Beside, because an
	// answer can also carry a cookie, learn a clock or teach the fallback table.
	STAT_ANSWER_MOVED,
	// Counted beside the entry that stands for OptionsSlowPath of a client segment whose
	// timestamp the core's compare found (OptionsFastPath): one without SYN and ACK whose
	// options start NOP NOP TS, routed as one without (STAT_FAST_CLIENT_FALLBACK,
	// STAT_FAST_FALLBACK_MISS, STAT_DROP_FALLBACK_SERVER_REMOVED), or a client's SYN-ACK
	// whose timestamp sits where Table 1 puts a SYN's, routed by its cookie
	// (STAT_FAST_CLIENT_COOKIE_WALKED, or a cookie drop with STAT_OPTIONS_WALKED).
	// STAT_OPTIONS_WALKED the other way round.
	STAT_OPTIONS_COMPARED,
	// A new connection to a VIP whose pool is empty (every server drained, removed or out
	// of it: vip_info.policy KERNEL_POLICY_EMPTY), dropped in the kernel as the core
	// drops it (`no_server_available`), after the counts its path made first: a SYN with
	// a timestamp (the options' count, STAT_OPTIONS_WALKED beside it when walked), one
	// without (the walk's), a fallback miss (the walk's and FallbackMisses), a
	// baseline's pick on the straight line (FastPath); the drop alone for a baseline's
	// pick on the general path and an ICMP error that nothing else routes (icmp_path.h).
	// So a SYN flood at an emptied VIP costs the kernel a lookup a SYN, not a worker trip.
	STAT_DROP_NO_SERVER_AVAILABLE_SYN,
	STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN,
	STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS,
	STAT_DROP_NO_SERVER_AVAILABLE_PICK,
	STAT_DROP_NO_SERVER_AVAILABLE,
	STAT_COUNT,
};
// Entries of the stats map: room for counters appended later, so that an upgrade which
// adds one keeps the map's definition, and so its pinned counters.
#define STAT_SLOTS 128

// Key of the backends map.
struct backend_key {
	__u32 addr; // network byte order
	__u16 port; // network byte order
	__u16 copy; // of the published tables (publish.h)
};

// Value of the backends map: which server and VIP a NAT backend (DIP, port) is.
struct backend_info {
	__u16 server;
	__u16 vip_index; // BACKEND_NO_VIP: no VIP's pool has this (DIP, port) now
	__u32 flags;     // BACKEND_*
};

// backend_info.flags: a removed server had this DIP (the core's `removed_server_at`), so
// a segment from it that no current backend explains is dropped (`server_removed`), not
// passed to the host.
#define BACKEND_DIP_OF_REMOVED (1u << 0)

// backend_info.vip_index of an allocated server's (DIP, port) that no current backend is
// (a removed server's, whose late replies the core drops as `server_removed`).
#define BACKEND_NO_VIP 0xffff

// Server ids (ServerId::SPACE) and unmasked cookies (2^16): the sizes of the arrays
// indexed by them, so an id or cookie read from a packet needs no bounds check.
#define SERVER_ID_SPACE 16384
#define COOKIE_SPACE 65536
// Entries of the VIP maps (vips, vips_by_index): as many as vip_addrs holds.
#define MAX_VIPS 4096
// Servers of a pool held in vip_info itself; a bigger one is in the VIP's vip_big_pools
// entry (struct vip_big_pool), which holds any pool: its members are distinct ids.
#define MAX_HASH_POOL 64
#define MAX_BIG_POOL SERVER_ID_SPACE

// The one entry of the lb_config array.
#define LB_FAST_PATH (1u << 0) // the in-kernel path is on ([daemon] datapath = "xdp")
// vips holds every VIP of the snapshot (there are at most MAX_VIPS): a TCP segment to a
// VIP address on a port vips does not hold is no VIP's.
#define LB_EVERY_VIP (1u << 1)
#define LB_MODE_CHEETAH 0
#define LB_MODE_HASH 1
#define LB_MODE_MAGLEV 2
#define LB_FORWARDING_L2 0
#define LB_FORWARDING_NAT 1
struct lb_config {
	__u32 flags;
	__u8 mode;
	__u8 forwarding;
	__u8 id_bits; // 16 - the cookie layout's epoch bits
	__u8 copy;    // which entry of lb_config this is: the copy of the tables it goes with
	__u16 id_mask; // (1 << id_bits) - 1
	__u16 pad2;
	__u32 generation; // the tables snapshot's generation these maps hold
	// The publisher's latch (bpf/lib/publish.h), in entry 0 only: its parity names the
	// copy of the published tables packets read; one more at every publication's flip.
	// Written only by userspace, through the map's mmap, with atomic stores.
	__u32 publish_seq;
	// The fallback table's sets - 1 (the fallback map holds fallback_mask + 1 sets).
	__u32 fallback_mask;
	// Slots of every VIP's Maglev table (maglev_tables; the config's maglev_table_size);
	// 0: no table is published.
	__u32 maglev_size;
	// CLOCK_MONOTONIC at which the daemon's clock read 0: the core's `now` is
	// bpf_ktime_get_ns() - clock_base_ns (the fallback path reads the coarse clock,
	// bpf_ktime_get_coarse_ns: the same clock as of the last tick). Written by
	// userspace's one setter (`SteeringProgram::set_clock_base`) through the map's mmap;
	// a publisher's update of the whole value carries it as it is.
	__u64 clock_base_ns;
	// Bit (address & 63) set for every address of vip_addrs (address as a number: the
	// core's vip_addr_bit): a clear bit says an address is no VIP's without a lookup
	// (vip_addr_filter.h).
	__u64 vip_addr_filter;
};

// Key of the vips map: a VIP's address, port and protocol.
struct vip_key {
	__u32 addr; // network byte order
	__u16 port; // network byte order
	__u8 protocol;
	__u8 copy; // of the published tables (publish.h)
};

// Key of the vip_addrs map: a VIP address and the copy of the tables (publish.h).
struct vip_addr_key {
	__u32 addr; // network byte order
	__u32 copy;
};

// Value of the vip_addrs map (a __u32): what the address is as a server's DIP, which the
// core asks of a NAT segment from it (worker.rs `classify`, `classify_rest`).
// A removed server had it (`removed_server_at`): such a segment is dropped. (No server
// that forwards can have it: the control plane refuses that DIP.)
#define VIP_ADDR_DIP_OF_REMOVED (1u << 0)

// Value of the vips map (by address and port) and of vips_by_index (by index).
struct vip_info {
	__u64 hash_prefix[4]; // SipHash-1-3 state after the VIP's word (core VipHashPrefix)
	__u32 addr;           // network byte order
	__u16 port;           // network byte order
	__u16 backend_port;   // network byte order (nat: the servers' port)
	__u16 index;          // the VIP's index in the tables snapshot
	__u16 pool_len;       // servers in the pool; 0 = not published (left to userspace),
			      // or more than the kernel holds (only maglev places its SYNs then)
	__u16 pool[MAX_HASH_POOL]; // the pool, if it has at most MAX_HASH_POOL servers
	__u8 policy;          // cheetah mode: KERNEL_POLICY_* the kernel places a SYN by
	__u8 load_metric;     // pow2, least loaded: LOAD_METRIC_* the pool's loads are compared under
	__u8 pad[2];
};

// Entries of vip_slots: a VIP's (address, port) -> its slot by vip_slot_of (vip_slots.h),
// a multiplicative hash to VIP_SLOT_BITS bits. Twice MAX_VIPS, so that most VIPs have a
// slot of their own; one whose slot is taken is found in vips alone.
#define VIP_SLOT_BITS 13
#define VIP_SLOTS (1 << VIP_SLOT_BITS)
#define VIP_SLOT_MULTIPLIER 0x9e3779b1u

// Value of the vip_slots array: what a client's established segment needs of the VIP at
// the slot (cheetah mode: its cookie's hash and its ports), and `tag` saying which
// (address, port) it is: VIP_SLOT_USED | port << 32 | address, both as the packet carries
// them (network byte order, read as numbers); 0 for an empty slot. Nothing a pool change
// rewrites, so a publication rewrites a slot in place only when its VIP's secret or ports
// change or another VIP takes it; one cache line.
#define VIP_SLOT_USED (1ull << 48)
struct vip_slot {
	__u64 tag;
	__u64 hash_prefix[4]; // vip_info.hash_prefix
	__u16 port;           // network byte order
	__u16 backend_port;   // network byte order
	__u32 pad;
	__u64 pad2[2];
};

// vip_info.policy: the VIP policies the kernel runs for a SYN (crates/core/src/policy/),
// each bit for bit the core's. NONE (a pool bigger than MAX_HASH_POOL for every policy
// but maglev, and the other envelopes xdp_tables.rs `kernel_policy` names) leaves the SYN
// to userspace; EMPTY (no server in the pool, whatever the policy and mode) drops every
// new connection, as the core does.
#define KERNEL_POLICY_NONE 0
#define KERNEL_POLICY_RR 1
#define KERNEL_POLICY_WRR 2
#define KERNEL_POLICY_RANDOM 3
#define KERNEL_POLICY_HASH 4
// Power of two choices and least loaded over this CPU's load view (struct active_row,
// struct published_row),
// under the pool's metric (vip_info.load_metric).
#define KERNEL_POLICY_POW2 5
#define KERNEL_POLICY_LEAST_LOADED 6
// awrr: smooth WRR over buckets the daemon derives from loads at every fold, served from
// their cycle (awrr_schedules; no cycle: the balanced buckets, one pick per position).
#define KERNEL_POLICY_AWRR 7
// maglev: the VIP's Maglev table (maglev_tables) at the connection's hash, as the maglev
// mode and the connections without timestamps use it; any pool size (vip_info.pool unread).
#define KERNEL_POLICY_MAGLEV 8
#define KERNEL_POLICY_EMPTY 9
#define LOAD_METRIC_ACTIVE 0
#define LOAD_METRIC_REPORTED 1
#define LOAD_METRIC_PACKETS 2
#define LOAD_METRIC_BYTES 3

// The load view pow2 and least loaded compare (policy.h, load_view.h): what a core
// worker's LoadView::load gives, as userspace published it at its last fold (every 50 ms,
// kernel_loads.rs), plus, for active connections, this CPU's own counts since.
//
// Value of the active_rows array (by CPU): that CPU's view of every server's active
// connections, one contiguous row indexed by server id, so that a scan looks the row up
// once and reads one entry a position. In an entry, `base` is written by userspace only
// (through a mapping, an aligned 8-byte store) and `own` by that CPU's program only (its
// opened + moved_in - closed, incremented beside server_traffic's): no write of one side
// covers a word of the other. `base` is the process-wide active-connection estimate at
// the fold minus `own` as server_traffic had it at the fold, so that base + own (wrapping,
// then at least 0) is the total plus this CPU's own picks and closes since, as a worker's
// view is its last merge plus its own deltas.
struct active_load {
	__s64 base;
	__u64 own;
};

struct active_row {
	struct active_load server[SERVER_ID_SPACE];
};

// Value of the published_loads array (by LOAD_METRIC_*; the active metric's entry is
// unused, looked up only to keep the verifier's paths simple, load_view.h): every
// server's load under that metric, the same for every CPU, as f64 bits of non-negative
// loads (+0.0 for zero, so that the integers order as the floats do): the reported load
// and the packet and byte rates (the core's moving averages), which the core moves at
// merges only. Userspace writes it word by word through a mapping: a read never tears a
// word, and a pool whose words come from two folds is still a pool of loads.
#define LOAD_METRICS 4

struct published_row {
	__u64 server[SERVER_ID_SPACE];
};

// Value of the vip_big_pools hash map (by VIP index, as an array's): the pool of a VIP with
// more than MAX_HASH_POOL servers and at most MAX_BIG_POOL, by position, where vip_info
// has no room for it.
struct vip_big_pool {
	__u16 id[MAX_BIG_POOL];
};

// Value of the vip_weights array (by VIP index), for a wrr VIP: the configured weight of
// each pool position (at least 1, as the core's SmoothWeights takes them) and their sum.
struct vip_weights {
	__s64 total;
	__u32 weight[MAX_HASH_POOL];
};

// Value of the wrr_schedules and awrr_schedules hash maps (by VIP index): one cycle of
// smooth-WRR picks from zero credits as pool positions (core Schedule,
// crates/core/src/policy/schedule.rs), `len` entries, its first SCHEDULE_CAP here. A
// cycle picks every position at least once; pools hold at most MAX_BIG_POOL positions:
// 16 bits each (32 KiB + 4 a value). (Pinned maps of earlier builds' smaller values have
// another value size and are replaced, as pin.rs replaces any map defined otherwise.)
#define SCHEDULE_CAP 16384
struct vip_schedule {
	__u32 len;
	__u16 position[SCHEDULE_CAP];
};

// A wrr cycle over SCHEDULE_CAP entries (of a pool over MAX_HASH_POOL servers, whose
// credits the kernel cannot scan) goes on in chunks of SCHEDULE_CAP entries, chunk c
// (1 to SCHEDULE_CHUNKS - 1) holding entries c * SCHEDULE_CAP on, in wrr_schedule_chunks:
// at most SCHEDULE_CHUNKS * SCHEDULE_CAP entries a cycle, and SCHEDULE_CHUNK_BUDGET
// chunks (32 KiB each) a copy of the tables, which the daemon shares out in VIP order.
#define SCHEDULE_CHUNKS 32
#define SCHEDULE_MAX_LEN (SCHEDULE_CHUNKS * SCHEDULE_CAP)
#define SCHEDULE_CHUNK_BUDGET 1024
struct schedule_chunk_key {
	__u16 index; // the VIP's index
	__u8 chunk;  // 1 to SCHEDULE_CHUNKS - 1
	__u8 copy;   // of the published tables (publish.h)
};
struct schedule_chunk {
	__u16 position[SCHEDULE_CAP];
};

// Value of the per-CPU policy_state array (by VIP index): this CPU's instance of the
// VIP's policy, seeded by userspace on every snapshot that changes the VIP's pool, policy
// or weights (as a core worker rebuilds its instance), then advanced by the kernel.
// rr: the core RoundRobin's cursor. wrr and awrr from a schedule: the core Schedule's
// cursor (schedule_cursor). wrr by the scan: the core SmoothWeights' credits, kept as
// credit[i] = wrr_base[i] + wrr_steps * weight[i] (wrapping), so that a pick writes two
// words, not every credit, and needs no weight once it has decided.
struct policy_state {
	__u32 rr_position; // rr's cursor; least loaded's (LeastLoaded's, start of its next scan)
	__u32 schedule_cursor;
	__u64 wrr_steps;
	__s64 wrr_base[MAX_HASH_POOL];
};

// Value of the per-CPU policy_rng array's one entry: the state of this CPU's Xoshiro256++
// generator (core PolicyRng), which every random pick on the CPU draws from, as every
// random pick of a core worker draws from its one generator.
struct policy_rng {
	__u64 s[4];
};

// The core's HandshakeTable (crates/core/src/lb/handshakes.rs), words shared with
// userspace in the one entry of the mmapable handshakes array: `slot` the recent SYNs and
// the server holding each one's load count, `retry` the filter of recent retries.
#define HANDSHAKE_SLOTS (1 << 18)
#define HANDSHAKE_RETRY_SLOTS (1 << 12)
struct handshake_words {
	__u64 slot[HANDSHAKE_SLOTS];
	__u16 retry[HANDSHAKE_RETRY_SLOTS];
};

// Value of the servers array, indexed by server id.
#define SERVER_FORWARDS (1u << 0) // its cookies route and replies are taken (SlotState::forwards)
#define SERVER_EGRESS (1u << 1)   // egress_ifindex and both MACs are resolved
#define SERVER_REMOVED (1u << 2)  // retired (SlotState::Removed): not allocated if unset
struct server_info {
	__u32 flags;
	__u32 dip; // network byte order
	__u32 egress_ifindex;
	__u8 dst_mac[6]; // the server's MAC (or its gateway's)
	__u8 src_mac[6]; // the egress interface's MAC
};

// Key of the server_macs map (l2 replies): a server's MAC; value: its id (__u32).
struct mac_key {
	__u8 mac[6];
	__u16 copy; // of the published tables (publish.h)
};

// What identifies a server's reply before any other lookup (a reply_slot's key).
// l2: the VIP's address and port (the reply's source) and the server's MAC (its source
// MAC); nat: the backend's address and port (the reply's source), `mac` all zero.
struct reply_key {
	__u32 addr; // network byte order
	__u16 port; // network byte order
	__u8 mac[6];
};

// A reply_slot's sender: everything the reply path reads about its sender, so
// that one lookup replaces steering's and the sender's (vip_addrs, server_macs, vips or
// backends and vips_by_index, servers). Only forwarding servers' entries are published:
// anything else is found the old way (steering, then the sender's maps).
struct reply_sender {
	__u64 hash_prefix[4]; // the VIP's (vip_info.hash_prefix)
	__u32 vip_addr;       // network byte order
	__u16 vip_port;       // network byte order
	__u16 server;         // the server's id
};

// The reply_senders array: a sender (one per forwarding server and VIP it answers for in
// l2, per NAT backend in nat) at the slot its key hashes to (reply_sender.h
// reply_slot_of, a multiplicative hash to REPLY_SLOT_BITS bits); `used` says the slot
// holds `key`'s sender. A sender whose slot another took is found the old way.
#define REPLY_SLOT_BITS 16
#define REPLY_SLOTS (1 << REPLY_SLOT_BITS)
#define REPLY_SLOT_MULTIPLIER 0x9e3779b97f4a7c15ull
struct reply_slot {
	struct reply_key key;
	__u32 used;
	struct reply_sender sender;
	__u64 pad;
};

// Value of the per-CPU server_traffic array: what the in-kernel path sent to or received
// from each server, folded into the core's loads by userspace.
// 48 bytes, not 40: entries 8 bytes apart would put some entries' packets and bytes
// across two cache lines, which every packet writes.
struct server_traffic {
	__u64 packets;
	__u64 bytes;  // IP bytes, as the core counts them
	__u64 opened; // connections the kernel placed on this server (a policy's pick for a SYN)
	__u64 closed; // counts the kernel released here: closes (lb/closes.rs rules), a retried
		      // SYN's earlier pick, a count a SYN-ACK moved away
	__u64 moved_in; // counts a SYN-ACK moved here (+1 active, no new connection)
	__u64 pad;
};

// The core's close filter (lb/closes.rs CloseFilter, DEFAULT_SLOTS words) as the one
// entry of the mmapable closes array, shared with userspace like the clock words: slot
// `flow hash & (CLOSE_SLOTS - 1)` holds the tag of the last close counted there (0: none).
#define CLOSE_SLOTS 65536
struct close_words {
	__u32 word[CLOSE_SLOTS];
};

// The words of the clock table (core cookie/msb.rs) that the kernel reads, in two
// mmapable arrays shared with userspace, each ONE entry holding every word (an array map
// spaces its entries 8 bytes apart, so one entry per word would not be the contiguous
// words the core indexes): msb_seen word[server id] = MSB_KNOWN | newest MSB seen;
// msb_restores word[unmasked cookie] = MSB_KNOWN | MSB_BEYOND_IDLE_LIMIT? | the restored
// MSB, whose two low bytes in memory are the packet's (network order).
#define MSB_KNOWN (1u << 16)
#define MSB_BEYOND_IDLE_LIMIT (1u << 17)

// The rest of the clock table's words (core cookie/msb.rs `ClockWords`), the one entry of
// the mmapable msb_clock array: what learning a reply reads and writes besides msb_seen
// and msb_restores, so that the kernel learns a reply whose MSB moved (clock_learn.h) in
// the very words the workers and health probes do. anchors and limits: `(LB ms as u32) <<
// 32 | TSval`, or MSB_UNKNOWN_ANCHOR; estimates: `generation | MSB_KNOWN | M^`, the
// generation counted in units of MSB_GENERATION_ONE; probed: 1 once a health probe
// anchored the clock; writes: bumped on every write of an estimate (the persister's cue).
#define MSB_GENERATION_ONE (1u << 17)
#define MSB_UNKNOWN_ANCHOR 0xffffffffffffffffULL
// The core's bounds on a reply's clock: ticks a minute, the slack in ticks, and the
// share (1 >> shift) by which a server clock may run faster or slower than the LB's.
#define MSB_MAX_TICKS_PER_MINUTE 65536
#define MSB_TICK_SLACK 2000
#define MSB_DRIFT_ALLOWANCE_SHIFT 11
struct msb_clock_words {
	__u64 anchors[SERVER_ID_SPACE];
	__u64 limits[SERVER_ID_SPACE];
	__u32 estimates[SERVER_ID_SPACE];
	__u8 probed[SERVER_ID_SPACE];
	__u64 writes;
};

// One set of the fallback table (core lb/fallback.rs), one entry of the fallback map: an
// array's entries of 64 bytes are contiguous, so the mmapped map is the core's sets, and
// one lookup reads the set's cache line. A word packs valid:1 | reserved:1 | server:14 |
// time:16 | tag:32 (tag = the flow hash's high half, time = last use in 2^30 ns units).
#define FALLBACK_WAYS 8
struct fallback_set {
	__u64 way[FALLBACK_WAYS];
};

// The Maglev tables (core policy/maglev.rs), one inner array per VIP in the
// maglev_tables array of maps (by VIP index): slot s of a table (flow hash % maglev_size)
// is server[s % MAGLEV_CHUNK_SLOTS] of entry s / MAGLEV_CHUNK_SLOTS. An array spaces its
// entries 8 bytes apart, so one u16 per entry would take four times the core's bytes; a
// chunk is one cache line of the core's slots.
#define MAGLEV_CHUNK_SLOTS 32
#define MAGLEV_NO_SERVER 0xffff // a slot past the table's end in its last chunk
struct maglev_chunk {
	__u16 server[MAGLEV_CHUNK_SLOTS];
};

// Key of the next_hops LPM trie: an IPv4 prefix in one copy of the tables (publish.h),
// struct bpf_lpm_trie_key's layout: the copy's 32 bits come first, so `prefixlen` is 32
// more than the prefix's length.
struct next_hop_key {
	__u32 prefixlen;
	__u32 copy;
	__u32 addr; // network byte order
};

// Key of next_hop_hosts: a destination address in one copy of the tables.
struct next_hop_host_key {
	__u32 addr; // network byte order
	__u32 copy;
};

// Value of next_hops (and of next_hop_hosts): what bpf_fib_lookup would answer for every
// destination of the prefix, filled by userspace from the kernel's routes and neighbours
// (crates/daemon/src/dataplane/next_hops.rs). The trie holds routes only, so it stays
// shallow; an on-link route's hosts, one MAC each, are in the next_hop_hosts hash.
#define MAX_NEXT_HOPS 16384
#define NEXT_HOP_FIB 0     // no answer here: ask bpf_fib_lookup
#define NEXT_HOP_KNOWN 1   // this entry is the answer
#define NEXT_HOP_ON_LINK 2 // an on-link route: the host's entry in next_hop_hosts, else the FIB
struct next_hop {
	__u32 kind;    // NEXT_HOP_*
	__u32 ifindex; // egress interface
	__u32 mtu;     // an IP packet longer than this needs the FIB's answer (FRAG_NEEDED)
	__u8 dmac[6];  // the neighbour's MAC (the gateway's, or the destination's on-link)
	__u8 smac[6];  // the egress interface's MAC
};

#endif
