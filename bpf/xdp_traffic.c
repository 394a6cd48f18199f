// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// `cheetah bench --xdp-live` (crates/lab/src/bench/xdp_live.rs): the sender and the sink.
//
// - traffic_send is run by BPF_PROG_TEST_RUN in live-frames mode
//   (BPF_F_TEST_XDP_LIVE_FRAMES, the kernel's own traffic generator, the one xdp-trafficgen
//   drives): every run writes frame i of `traffic_frames` (i cycling over the flows, per
//   CPU) into the packet and redirects it out of the sender's veth, so the LB's veth
//   receives real frames at the rate one CPU can make them. It rewrites the whole frame
//   every time because a live frame's page comes back from the receiver as the receiver
//   left it.
// - With `via_cpumap`, traffic_send hands the frame to the LB's CPU through the cpumap
//   `traffic_cpus` instead, and traffic_hop, run there by the cpumap's kernel thread,
//   sends it out of the sender's veth: the veth's transmit then schedules the LB end's
//   NAPI on the LB's CPU (a veth's NAPI runs where the frames were transmitted).
// - traffic_sink, on the sender's veth, drops what the LB sent back and counts it per CPU
//   in `received` (the veth's own `ethtool -S` counters count it too).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// Every frame has the same length (the test run's packet); the ACKs the bench sends are
// 66 bytes.
#define TRAFFIC_FRAME_MAX 128
#define TRAFFIC_FLOWS_MAX 4096

struct traffic_frame {
	__u8 bytes[TRAFFIC_FRAME_MAX];
};

struct traffic_config {
	__u32 flows;   // frames in use in traffic_frames
	__u32 len;     // bytes of each
	__u32 ifindex; // the sender's veth
	__u32 via_cpumap;
	__u32 lb_cpu; // traffic_cpus' entry, with via_cpumap
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TRAFFIC_FLOWS_MAX);
	__type(key, __u32);
	__type(value, struct traffic_frame);
} traffic_frames SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct traffic_config);
} traffic_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} traffic_cursor SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} traffic_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} received SEC(".maps");

SEC("xdp")
int traffic_send(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct traffic_config *config = bpf_map_lookup_elem(&traffic_config, &zero);
	__u32 *cursor = bpf_map_lookup_elem(&traffic_cursor, &zero);
	struct traffic_frame *frame;
	__u32 flow, len;

	if (!config || !cursor || config->flows == 0)
		return XDP_ABORTED;
	flow = *cursor;
	*cursor = flow + 1 < config->flows ? flow + 1 : 0;
	frame = bpf_map_lookup_elem(&traffic_frames, &flow);
	if (!frame)
		return XDP_ABORTED;
	len = config->len;
	if (len == 0 || len > TRAFFIC_FRAME_MAX)
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, frame->bytes, len))
		return XDP_ABORTED;
	if (config->via_cpumap)
		return bpf_redirect_map(&traffic_cpus, config->lb_cpu, 0);
	return bpf_redirect(config->ifindex, 0);
}

SEC("xdp/cpumap")
int traffic_hop(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct traffic_config *config = bpf_map_lookup_elem(&traffic_config, &zero);

	if (!config)
		return XDP_ABORTED;
	return bpf_redirect(config->ifindex, 0);
}

SEC("xdp")
int traffic_sink(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *packets = bpf_map_lookup_elem(&received, &zero);

	if (packets)
		*packets += 1;
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
