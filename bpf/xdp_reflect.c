// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// `cheetah bench --xdp-live` (crates/lab/src/bench/xdp_live.rs): the yardstick the live LB
// is held against. xdp_reflect does the least an XDP program can do to forward a frame back
// where it came from: swap the Ethernet addresses and XDP_TX. The bench attaches it to the
// same veth as cheetah_lb, fed by the same sender, so the pair's difference is the LB's
// own work. It counts per CPU in `seen`, which says on which CPU it ran.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} seen SEC(".maps");

static __always_inline void count(void)
{
	__u32 key = 0;
	__u64 *packets = bpf_map_lookup_elem(&seen, &key);

	if (packets)
		*packets += 1;
}

SEC("xdp")
int xdp_reflect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	unsigned char mac[ETH_ALEN];

	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	count();
	return XDP_TX;
}

char LICENSE[] SEC("license") = "GPL";
