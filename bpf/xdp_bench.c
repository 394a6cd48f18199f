// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// `cheetah bench --xdp` (crates/lab/src/bench/xdp.rs): the LB's whole XDP path,
// lb_process() from lib/lb.h with every map of lib/maps.h, timed by BPF_PROG_TEST_RUN.
//
// Both programs first copy a pristine frame from bench_frame into the packet, so that a
// run sees the same frame whatever an earlier run wrote (BPF_PROG_TEST_RUN with repeat > 1
// does not reset the packet). bench_trivial does the same copy and returns XDP_TX: its time
// is what the harness subtracts to get the LB's own cost.
//
// Two more sets of programs (further down) explain that cost:
// - bench_client_stage_K / bench_reply_stage_K run the first K stages of the established
//   client->server and server->client paths of lib/fast_path.h, built from the same lib
//   functions in the same order, and return XDP_TX (XDP_ABORTED if a stage did not find
//   what the whole path finds). The harness times them in one round with bench_trivial
//   and bench_lb, so each stage's increment is the median of per-round differences.
// - bench_flows_*: the frame's client (address, port and, toward a server, the cookie it
//   echoes) taken from flow i of bench_flows, i cycling over bench_flow_count flows, for
//   the LB itself and for bench_katran_lru, a connection-table path (5-tuple -> server id
//   in an LRU hash, as Katran's) standing in for the fallback LRU stage 1 does not have.

#include "lib/lb.h"

// Longest frame the bench copies: a TCP segment with NOP NOP TS and a short payload.
#define BENCH_FRAME_MAX 256

struct bench_frame {
	__u32 len; // bytes of `bytes` in use: exactly the test run's packet length
	__u8 bytes[BENCH_FRAME_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bench_frame);
} bench_frame SEC(".maps");

static __always_inline int restore_frame(struct xdp_md *ctx)
{
	__u32 key = 0;
	struct bench_frame *frame = bpf_map_lookup_elem(&bench_frame, &key);
	__u32 len;

	if (!frame)
		return 0;
	len = frame->len;
	if (len == 0 || len > BENCH_FRAME_MAX)
		return 0;
	return bpf_xdp_store_bytes(ctx, 0, frame->bytes, len) == 0;
}

static __always_inline struct iphdr *bench_ip(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);

	if ((void *)(ip + 1) > data_end)
		return NULL;
	return ip;
}

SEC("xdp")
int bench_lb(struct xdp_md *ctx)
{
	if (!restore_frame(ctx))
		return XDP_ABORTED;
	return lb_process(ctx);
}

// The LB inlined into the program, without vlan.h's tag check, ip_options.h's and the call
// to the global cheetah_decide that lb_process makes: the breakdown runs it before
// bench_lb, so their difference is what those three cost an untagged frame.
SEC("xdp")
int bench_lb_inline(struct xdp_md *ctx)
{
	if (!restore_frame(ctx))
		return XDP_ABORTED;
	return lb_decide(ctx, 0);
}

// The global cheetah_decide called as lb_process calls it, without the tag and IP options
// checks: run between bench_lb_inline and bench_lb, it splits what the call costs from
// what the checks cost.
SEC("xdp")
int bench_lb_call(struct xdp_md *ctx)
{
	if (!restore_frame(ctx))
		return XDP_ABORTED;
	return cheetah_decide(ctx, 0);
}

// bench_lb again, at another address: the breakdown runs it after bench_lb, so the
// difference between the two, the same code, says how far placement alone moves a
// program's time (the resolution of the stage increments).
SEC("xdp")
int bench_lb_twin(struct xdp_md *ctx)
{
	if (!restore_frame(ctx))
		return XDP_ABORTED;
	return lb_process(ctx);
}

SEC("xdp")
int bench_trivial(struct xdp_md *ctx)
{
	if (!restore_frame(ctx))
		return XDP_ABORTED;
	return XDP_TX;
}

// The LB and a bare XDP_TX without the frame copy, for programs timed unwrapped
// (bench/xdp_katran.rs: Katran's own program, which cannot be wrapped without building its
// code into ours). With repeat = 1 every run gets a fresh frame anyway; the copy only keeps
// the wrapped rows comparable with their breakdown's stage programs.
SEC("xdp")
int bench_lb_bare(struct xdp_md *ctx)
{
	return lb_process(ctx);
}

SEC("xdp")
int bench_bare_tx(struct xdp_md *ctx)
{
	return XDP_TX;
}

// Only the next-hop lookup the server->client path makes (lib/steer.h fib_toward_client),
// after the same copy: how much of that path's time is the kernel's FIB.
SEC("xdp")
int bench_fib(struct xdp_md *ctx)
{
	struct bpf_fib_lookup fib;
	struct iphdr *ip;

	if (!restore_frame(ctx))
		return XDP_ABORTED;
	ip = bench_ip(ctx);
	if (!ip)
		return XDP_ABORTED;
	if (fib_toward_client(ctx, ip, bpf_ntohs(ip->tot_len), &fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_ABORTED;
	return XDP_TX;
}


// The stages' results, kept alive: a value passed to an empty asm is one clang must
// compute, so no stage is dropped for its result being unused.
#define SINK(value) asm volatile("" ::"r"(value))

// Stage K of a path runs when `upto` >= K; `upto` is a constant in every program, so clang
// folds the tests and each program holds exactly its prefix.
#define STAGE_DONE(k)                                                                          \
	do {                                                                                   \
		if (upto == (k))                                                               \
			return XDP_TX;                                                         \
	} while (0)

// lb_process() for an established client segment in cheetah mode (lb_config,
// parse_plain_tcp, vip_slot_at, client_by_cookie, forward_to_server), cut after stage
// `upto`:
//   1 lb_config and parse_plain_tcp (eth/IPv4/TCP bounds and layout)
//   2 the VIP filter, the ACK / NOP NOP TS checks and vip_slots[slot of (daddr, dport)]:
//     the segment's VIP, which is also its classification
//   3 (nothing since the checks moved into 2: kept so that the stages keep their numbers)
//   3 the ACK / NOP NOP TS checks
//   4 SipHash finish and cookie unmask
//   5 servers[id] and msb_restores[unmasked] (the decode's two reads)
//   6 TSecr rewrite with its checksum, both MACs
//   7 server_traffic[id] and the stats counter
// The whole path (bench_lb) adds send_out (XDP_TX here).
static __always_inline int client_stages(struct xdp_md *ctx, const int upto)
{
	struct cookie_layout layout;
	struct server_info *server;
	const struct vip_slot *slot;
	struct lb_config *config;
	struct plain_tcp p = {}; // as lb.h: no IP options lifted
	__u16 unmasked = 0, restored = 0;
	__u32 zero = 0, id = 0, copy;
	__u64 hash = 0;

	if (!restore_frame(ctx))
		return XDP_ABORTED;

	// As lb_process: the word, then the copy's entry (lib/publish.h).
	config = bpf_map_lookup_elem(&lb_config, &zero);
	if (!config)
		return XDP_ABORTED;
	copy = publish_copy(publish_begin(config));
	config = bpf_map_lookup_elem(&lb_config, &copy);
	if (!config || !(config->flags & LB_FAST_PATH) || config->mode != LB_MODE_CHEETAH)
		return XDP_ABORTED;
	if (parse_plain_tcp(ctx, &p) != PLAIN_OK)
		return XDP_ABORTED;
	STAGE_DONE(1);

	if (!may_be_vip_addr(config, p.ip->daddr) || !established(&p) ||
	    !plain_has_nop_nop_ts(&p))
		return XDP_ABORTED;
	slot = vip_slot_at(copy, p.ip->daddr, p.tcp->dest);
	if (!slot)
		return XDP_ABORTED;
	STAGE_DONE(2);
	STAGE_DONE(3);

	layout = layout_of(config);
	hash = siphash_finish(slot->hash_prefix, p.ip->saddr, p.tcp->source);
	unmasked = cookie_unmask(layout, bpf_ntohs(*(__be16 *)&p.ts->tsecr), hash);
	id = cookie_server(layout, unmasked);
	SINK(id);
	SINK(unmasked);
	STAGE_DONE(4);

	server = server_at(copy, id);
	if (!server || !(server->flags & SERVER_FORWARDS))
		return XDP_ABORTED;
	if (cookie_restore(&msb_restores, unmasked, &restored) != COOKIE_RESTORED)
		return XDP_ABORTED;
	if (!(server->flags & SERVER_EGRESS))
		return XDP_ABORTED;
	SINK(restored);
	STAGE_DONE(5);

	csum_replace_high_half_in_network_order((__u16 *)&p.ts->tsecr, &p.tcp->check, restored);
	__builtin_memcpy(p.eth->h_dest, server->dst_mac, ETH_ALEN);
	__builtin_memcpy(p.eth->h_source, server->src_mac, ETH_ALEN);
	STAGE_DONE(6);

	add_server_traffic(id, plain_ip_len(&p), 0);
	count(STAT_FAST_CLIENT_COOKIE);
	return XDP_TX;
}

// lb_process() for a server's reply in cheetah mode with l2 forwarding (lb_config,
// parse_plain_tcp, the VIP filter, reply_known, reply_fast), cut after stage `upto`:
//   1 lb_config, parse_plain_tcp and the VIP filter: the destination is no VIP's address
//     (so neither vips nor vip_addrs is asked)
//   2 the sender: server_side[ingress], reply_senders[slot of (saddr, sport, src MAC)]
//   3 flags and NOP NOP TS checks, msb_seen and the clock check
//   4 SipHash finish and cookie encode
//   5 the next hop toward the client (lib/next_hop.h: this CPU's next_hop_cache slot; on a
//     miss the next_hops map, and the FIB on a miss there)
//   6 TSval rewrite with its checksum, MACs from the next hop
//   7 server_traffic[id] and the stats counter
// The whole path (bench_lb) adds send_out (bpf_redirect here).
static __always_inline int reply_stages(struct xdp_md *ctx, const int upto)
{
	const struct reply_sender *sender;
	struct cookie_layout layout;
	struct msb_seen_words *seen;
	struct lb_config *config;
	struct next_hop_found hop;
	struct plain_tcp p = {}; // as lb.h: no IP options lifted
	__u32 zero = 0, id = 0, seq, copy;
	__u16 msb, cookie;
	__u64 hash;

	if (!restore_frame(ctx))
		return XDP_ABORTED;

	// As lb_process: the word, then the copy's entry (lib/publish.h).
	config = bpf_map_lookup_elem(&lb_config, &zero);
	if (!config)
		return XDP_ABORTED;
	seq = publish_begin(config);
	copy = publish_copy(seq);
	config = bpf_map_lookup_elem(&lb_config, &copy);
	if (!config || !(config->flags & LB_FAST_PATH) || config->mode != LB_MODE_CHEETAH ||
	    config->forwarding != LB_FORWARDING_L2)
		return XDP_ABORTED;
	if (parse_plain_tcp(ctx, &p) != PLAIN_OK)
		return XDP_ABORTED;
	if (may_be_vip_addr(config, p.ip->daddr))
		return XDP_ABORTED;
	STAGE_DONE(1);

	if (!on_server_side(copy, ctx->ingress_ifindex))
		return XDP_ABORTED;
	sender = reply_lookup(config, &p);
	if (!sender)
		return XDP_ABORTED;
	id = sender->server;
	SINK(id);
	STAGE_DONE(2);

	if (tcp_flags(p.tcp) & (TCP_SYN | TCP_FIN | TCP_RST))
		return XDP_ABORTED;
	if (!plain_has_nop_nop_ts(&p))
		return XDP_ABORTED;
	msb = bpf_ntohl(p.ts->tsval) >> 16;
	seen = bpf_map_lookup_elem(&msb_seen, &zero);
	if (!seen || !cookie_clock_unchanged(seen->word[id & (SERVER_ID_SPACE - 1)], msb))
		return XDP_ABORTED;
	STAGE_DONE(3);

	layout = layout_of(config);
	hash = siphash_finish(sender->hash_prefix, p.ip->daddr, p.tcp->dest);
	cookie = cookie_encode(layout, id, hash, msb);
	SINK(cookie);
	STAGE_DONE(4);

	if (!next_hop_toward_client(ctx, p.ip, plain_ip_len(&p), copy, seq, &hop))
		return XDP_ABORTED;
	next_hop_remember(&hop, p.ip->daddr, seq);
	STAGE_DONE(5);

	csum_replace_high_half((__u16 *)&p.ts->tsval, &p.tcp->check, cookie);
	__builtin_memcpy(p.eth->h_dest, hop.hop.dmac, ETH_ALEN);
	__builtin_memcpy(p.eth->h_source, hop.hop.smac, ETH_ALEN);
	STAGE_DONE(6);

	add_server_traffic(id, plain_ip_len(&p), 0);
	count(STAT_FAST_SERVER_COOKIE);
	return XDP_TX;
}

#define CLIENT_STAGE(k)                                                                        \
	SEC("xdp") int bench_client_stage_##k(struct xdp_md *ctx)                              \
	{                                                                                      \
		return client_stages(ctx, k);                                                  \
	}
#define REPLY_STAGE(k)                                                                         \
	SEC("xdp") int bench_reply_stage_##k(struct xdp_md *ctx)                               \
	{                                                                                      \
		return reply_stages(ctx, k);                                                   \
	}

CLIENT_STAGE(1)
CLIENT_STAGE(2)
CLIENT_STAGE(3)
CLIENT_STAGE(4)
CLIENT_STAGE(5)
CLIENT_STAGE(6)
CLIENT_STAGE(7)
REPLY_STAGE(1)
REPLY_STAGE(2)
REPLY_STAGE(3)
REPLY_STAGE(4)
REPLY_STAGE(5)
REPLY_STAGE(6)
REPLY_STAGE(7)

// ---- Many flows -------------------------------------------------------------------------

// One flow's client as it lies in the packet, and the cookie its ACKs echo (TSecr's first
// two bytes) for the cheetah LB's client path.
struct bench_flow {
	__be32 addr;
	__be16 port;
	__be16 cookie;
};

// Sized by userspace before loading (to the largest flow count it asks for; one entry
// otherwise, so the other benches do not allocate it).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bench_flow);
} bench_flows SEC(".maps");

// Key 0: how many flows of bench_flows a curve point cycles over.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_flow_count SEC(".maps");

// The next flow of each program (enum flow_cursor), per CPU: the timed program and the
// trivial one it is compared with keep cursors of their own, which userspace starts half
// a cycle apart, so neither finds its flow in cache because the other just read it.
enum flow_cursor {
	CURSOR_SUBJECT,
	CURSOR_TRIVIAL,
	CURSOR_COUNT,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CURSOR_COUNT);
	__type(key, __u32);
	__type(value, __u32);
} bench_flow_cursor SEC(".maps");

// Where a flow's client goes in the frame: the source of a client's segment, the
// destination of a server's reply.
enum flow_side {
	FLOW_IS_SOURCE,
	FLOW_IS_DESTINATION,
};

// Ethernet + IPv4 without options: the addresses, then the ports of the TCP header after
// them, then TSecr of NOP NOP TS.
#define FRAME_SADDR 26
#define FRAME_DADDR 30
#define FRAME_SPORT 34
#define FRAME_DPORT 36
#define FRAME_TSECR 62

// restore_frame, then the next flow's client written into it. The checksums are left as
// they are: the LB never verifies one, only updates it.
static __always_inline int restore_flow_frame(struct xdp_md *ctx, __u32 cursor_key,
					      enum flow_side side)
{
	__u32 zero = 0, *count, *cursor, index;
	struct bench_flow *flow;
	void *data, *data_end;

	if (!restore_frame(ctx))
		return 0;
	count = bpf_map_lookup_elem(&bench_flow_count, &zero);
	cursor = bpf_map_lookup_elem(&bench_flow_cursor, &cursor_key);
	if (!count || !cursor || *count == 0)
		return 0;
	index = *cursor;
	if (index >= *count)
		index = 0;
	*cursor = index + 1;
	flow = bpf_map_lookup_elem(&bench_flows, &index);
	if (!flow)
		return 0;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + FRAME_TSECR + 2 > data_end)
		return 0;
	if (side == FLOW_IS_SOURCE) {
		*(__be32 *)(data + FRAME_SADDR) = flow->addr;
		*(__be16 *)(data + FRAME_SPORT) = flow->port;
		*(__be16 *)(data + FRAME_TSECR) = flow->cookie;
	} else {
		*(__be32 *)(data + FRAME_DADDR) = flow->addr;
		*(__be16 *)(data + FRAME_DPORT) = flow->port;
	}
	return 1;
}

SEC("xdp")
int bench_flows_client_lb(struct xdp_md *ctx)
{
	if (!restore_flow_frame(ctx, CURSOR_SUBJECT, FLOW_IS_SOURCE))
		return XDP_ABORTED;
	return lb_process(ctx);
}

SEC("xdp")
int bench_flows_client_trivial(struct xdp_md *ctx)
{
	if (!restore_flow_frame(ctx, CURSOR_TRIVIAL, FLOW_IS_SOURCE))
		return XDP_ABORTED;
	return XDP_TX;
}

SEC("xdp")
int bench_flows_reply_lb(struct xdp_md *ctx)
{
	if (!restore_flow_frame(ctx, CURSOR_SUBJECT, FLOW_IS_DESTINATION))
		return XDP_ABORTED;
	return lb_process(ctx);
}

SEC("xdp")
int bench_flows_reply_trivial(struct xdp_md *ctx)
{
	if (!restore_flow_frame(ctx, CURSOR_TRIVIAL, FLOW_IS_DESTINATION))
		return XDP_ABORTED;
	return XDP_TX;
}

// A connection table's key, as Katran's flow key: the 5-tuple.
struct bench_five_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 protocol;
	__u8 pad[3];
};

// One table shared by every CPU (no BPF_F_NO_COMMON_LRU), as the issue asks of the
// fallback: the SYN-ACK that teaches it arrives on another CPU than the client's packets.
// Userspace sizes it (all the flows, plus room for the CPUs' free lists, so that filling
// it evicts nothing) and fills it.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, struct bench_five_tuple);
	__type(value, __u32);
} bench_connections SEC(".maps");

// The established client->server path of a connection-table LB, on the cheetah LB's own
// steps (steering, lb_config, parse, vips, servers, MACs, accounting, send): where
// client_fast decodes the cookie (SipHash, msb_restores, TSecr rewrite), it looks the
// connection's 5-tuple up in bench_connections. A miss would be a new pick; the bench
// fills the table first, so a miss is XDP_ABORTED (a void run).
static __always_inline int katran_lru_client(struct xdp_md *ctx)
{
	struct bench_five_tuple tuple = {};
	struct toward_server to;
	struct backend_info *backend;
	struct server_info *server;
	struct lb_config *config;
	struct vip_key key = {};
	struct vip_info *vip;
	struct plain_tcp p;
	__u32 zero = 0, id, *found, copy;

	config = bpf_map_lookup_elem(&lb_config, &zero);
	if (!config)
		return XDP_ABORTED;
	copy = publish_copy(publish_begin(config));
	if (steer_owner(ctx, copy, &backend) != META_TO_VIP)
		return XDP_ABORTED;
	config = bpf_map_lookup_elem(&lb_config, &copy);
	if (!config || !(config->flags & LB_FAST_PATH))
		return XDP_ABORTED;
	if (parse_plain_tcp(ctx, &p) != PLAIN_OK)
		return XDP_ABORTED;
	key.addr = p.ip->daddr;
	key.port = p.tcp->dest;
	key.protocol = IPPROTO_TCP;
	key.copy = copy;
	vip = bpf_map_lookup_elem(&vips, &key);
	if (!vip)
		return XDP_ABORTED;
	tuple.saddr = p.ip->saddr;
	tuple.daddr = p.ip->daddr;
	tuple.sport = p.tcp->source;
	tuple.dport = p.tcp->dest;
	tuple.protocol = IPPROTO_TCP;
	found = bpf_map_lookup_elem(&bench_connections, &tuple);
	if (!found)
		return XDP_ABORTED;
	id = *found;
	server = server_at(copy, id);
	if (!server || !(server->flags & SERVER_EGRESS))
		return XDP_ABORTED;
	toward_server_of(&to, config, vip, server, id);
	return forward_to_server(ctx, &p, &to, STAT_FAST_CLIENT_PICK);
}

SEC("xdp")
int bench_flows_katran_lru(struct xdp_md *ctx)
{
	if (!restore_flow_frame(ctx, CURSOR_SUBJECT, FLOW_IS_SOURCE))
		return XDP_ABORTED;
	return katran_lru_client(ctx);
}

// The same server->client frame's next-hop lookup in the LB's next_hops trie alone
// (lib/next_hop.h's hit), and, for comparison, in a HASH map keyed by the /32 address (what
// a map filled on demand per client would be): what the LPM trie costs.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NEXT_HOPS);
	__type(key, __u32);
	__type(value, struct next_hop);
} bench_hop_by_address SEC(".maps");

SEC("xdp")
int bench_next_hop_trie(struct xdp_md *ctx)
{
	// Copy 0: a publication leaves both copies equal (lib/publish.h).
	struct next_hop_key key = { .prefixlen = 64 };
	struct next_hop *hop;
	struct iphdr *ip;

	if (!restore_frame(ctx))
		return XDP_ABORTED;
	ip = bench_ip(ctx);
	if (!ip)
		return XDP_ABORTED;
	key.addr = ip->daddr;
	hop = bpf_map_lookup_elem(&next_hops, &key);
	if (!hop || hop->kind != NEXT_HOP_KNOWN)
		return XDP_ABORTED;
	return XDP_TX;
}

// The per-CPU next_hop_cache slot a hit reads (lib/next_hop.h), without lb_config's
// sequence word, which lb_process reads anyway.
SEC("xdp")
int bench_next_hop_cache(struct xdp_md *ctx)
{
	struct next_hop_cached *cached;
	struct iphdr *ip;
	__u32 slot;

	if (!restore_frame(ctx))
		return XDP_ABORTED;
	ip = bench_ip(ctx);
	if (!ip)
		return XDP_ABORTED;
	slot = next_hop_cache_slot(ip->daddr);
	cached = bpf_map_lookup_elem(&next_hop_cache, &slot);
	if (!cached || cached->addr != ip->daddr || bpf_ntohs(ip->tot_len) > cached->hop.mtu)
		return XDP_ABORTED;
	return XDP_TX;
}

SEC("xdp")
int bench_next_hop_hash(struct xdp_md *ctx)
{
	struct next_hop *hop;
	struct iphdr *ip;
	__u32 daddr;

	if (!restore_frame(ctx))
		return XDP_ABORTED;
	ip = bench_ip(ctx);
	if (!ip)
		return XDP_ABORTED;
	daddr = ip->daddr;
	hop = bpf_map_lookup_elem(&bench_hop_by_address, &daddr);
	if (!hop || hop->kind != NEXT_HOP_KNOWN)
		return XDP_ABORTED;
	return XDP_TX;
}

char LICENSE[] SEC("license") = "GPL";
