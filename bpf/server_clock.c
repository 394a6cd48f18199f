// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// A testbed server's own TCP timestamp clock. Every network namespace shares the host's
// one TCP clock (with tcp_timestamps=2, TSval is CLOCK_MONOTONIC in ms), so without this
// all testbed servers would send the same TSvals and change their MSB at the same instant,
// and no test could see the LB mix up two servers' clocks. Attached with tc on a server's
// interface, the program shifts that server's clock by `clock_offset` on the wire:
//
// - egress: TSval += clock_offset on every IPv4 TCP segment with a timestamp option;
// - ingress: TSecr -= clock_offset, only when ACK is set (a SYN's TSecr is 0 and means
//   nothing, RFC 7323 section 3.2), so the server's TCP sees the echoes of its own clock.
//
// Anything it cannot parse goes through untouched: the program never drops.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_TIMESTAMP 8
#define TCPOLEN_TIMESTAMP 10
// The longest options area a TCP header can have (data offset 15).
#define MAX_OPTION_BYTES 40

// Set by the loader before load (crates/lab/src/testbed/server_clock.rs); rodata, so
// the verifier treats it as a constant.
const volatile __u32 clock_offset = 0;

// Where a segment's timestamp option sits, as offsets from the start of the frame.
struct ts_place {
	__u32 tsval;
	__u32 check;
	__u8 ack;
};

struct option_walk {
	struct __sk_buff *skb;
	__u32 pos;
	__u32 end;
	// Where the timestamp option's TSval is; 0 until found.
	__u32 tsval;
};

// One option per call: 0 to go on, 1 to stop (found, end of options, or malformed). Run by
// bpf_loop, so the verifier checks one step rather than every path through forty.
static long walk_one_option(__u64 index, void *data)
{
	struct option_walk *walk = data;
	__u32 pos = walk->pos;
	__u8 kind_len[2];

	if (pos >= walk->end || bpf_skb_load_bytes(walk->skb, pos, kind_len, 1))
		return 1;
	if (kind_len[0] == TCPOPT_EOL)
		return 1;
	if (kind_len[0] == TCPOPT_NOP) {
		walk->pos = pos + 1;
		return 0;
	}
	if (pos + 2 > walk->end || bpf_skb_load_bytes(walk->skb, pos, kind_len, 2))
		return 1;
	if (kind_len[1] < 2 || pos + kind_len[1] > walk->end)
		return 1;
	if (kind_len[0] == TCPOPT_TIMESTAMP) {
		if (kind_len[1] == TCPOLEN_TIMESTAMP)
			walk->tsval = pos + 2;
		return 1;
	}
	walk->pos = pos + kind_len[1];
	return 0;
}

// Finds the timestamp option of an IPv4 TCP segment; 0 when there is none or the headers
// or options are malformed.
static __always_inline int find_timestamps(struct __sk_buff *skb, struct ts_place *place)
{
	struct iphdr ip;
	struct tcphdr tcp;
	struct option_walk walk = {};
	__u32 l4;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr), &ip, sizeof(ip)))
		return 0;
	if (ip.version != 4 || ip.ihl < 5 || ip.protocol != IPPROTO_TCP)
		return 0;
	// Only a first fragment holds the TCP header.
	if (ip.frag_off & bpf_htons(0x1fff))
		return 0;
	l4 = sizeof(struct ethhdr) + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, l4, &tcp, sizeof(tcp)))
		return 0;
	if (tcp.doff < 5)
		return 0;
	walk.skb = skb;
	walk.pos = l4 + sizeof(tcp);
	walk.end = l4 + tcp.doff * 4;
	// Each step consumes at least one byte, so MAX_OPTION_BYTES steps cover any header.
	if (bpf_loop(MAX_OPTION_BYTES, walk_one_option, &walk, 0) < 0 || !walk.tsval)
		return 0;
	place->tsval = walk.tsval;
	place->check = l4 + offsetof(struct tcphdr, check);
	place->ack = tcp.ack;
	return 1;
}

// The checksum treats the segment as 16-bit words from its start. A 32-bit field at an
// odd offset spans three words, [x a] [b c] [d y], and contributes what the two words
// [d a] [b c] would at an even one: the bytes rotated by one.
static __always_inline __u32 as_summed(__u32 value_in_memory_order, __u32 offset_in_segment)
{
	__u8 *b = (__u8 *)&value_in_memory_order;
	__u32 rotated;
	__u8 *r = (__u8 *)&rotated;

	if (!(offset_in_segment & 1))
		return value_in_memory_order;
	r[0] = b[3];
	r[1] = b[0];
	r[2] = b[1];
	r[3] = b[2];
	return rotated;
}

// Adds `delta` to the 32-bit big-endian field at `at` and fixes the TCP checksum
// incrementally (bpf_l4_csum_replace leaves a CHECKSUM_PARTIAL packet's field alone, as it
// must: the device or the stack sums the final bytes later).
static __always_inline void shift_field(struct __sk_buff *skb, __u32 at, __u32 check,
					__u32 l4, __u32 delta)
{
	__u32 old_wire, new_wire;

	if (bpf_skb_load_bytes(skb, at, &old_wire, sizeof(old_wire)))
		return;
	new_wire = bpf_htonl(bpf_ntohl(old_wire) + delta);
	// The store first: it makes the packet writable, so once it succeeded the checksum
	// update cannot fail for want of memory and leave the two out of step.
	if (bpf_skb_store_bytes(skb, at, &new_wire, sizeof(new_wire), 0))
		return;
	bpf_l4_csum_replace(skb, check, as_summed(old_wire, at - l4), as_summed(new_wire, at - l4),
			    sizeof(__u32));
}

SEC("tc")
int server_clock_egress(struct __sk_buff *skb)
{
	struct ts_place place;

	if (clock_offset && find_timestamps(skb, &place))
		shift_field(skb, place.tsval, place.check,
			    place.check - offsetof(struct tcphdr, check), clock_offset);
	return TC_ACT_OK;
}

SEC("tc")
int server_clock_ingress(struct __sk_buff *skb)
{
	struct ts_place place;

	if (clock_offset && find_timestamps(skb, &place) && place.ack)
		shift_field(skb, place.tsval + 4, place.check,
			    place.check - offsetof(struct tcphdr, check), -clock_offset);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
