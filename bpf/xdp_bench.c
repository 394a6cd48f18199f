// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// `cheetah bench --xdp` (crates/lab/src/bench/xdp.rs): the LB's whole XDP path,
// lb_process() from lib/lb.h with every map of lib/maps.h, timed by BPF_PROG_TEST_RUN.
//
// Both programs first copy a pristine frame from bench_frame into the packet, so that a
// run sees the same frame whatever an earlier run wrote (BPF_PROG_TEST_RUN with repeat > 1
// does not reset the packet). bench_trivial does the same copy and returns XDP_TX: its time
// is what the harness subtracts to get the LB's own cost.

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

SEC("xdp")
int bench_trivial(struct xdp_md *ctx)
{
	if (!restore_frame(ctx))
		return XDP_ABORTED;
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
	if (fib_toward_client(ctx, ip, &fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_ABORTED;
	return XDP_TX;
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
	struct next_hop_key key = { .prefixlen = 32 };
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
