// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Bounds-checked views of the frames the in-kernel path takes: an untagged IPv4 frame
// without IP options or fragmentation carrying a TCP segment whose header has room for
// NOP NOP TS, all within the frame. The checks are crates/core/src/lb/fast_path.rs
// `plain_ipv4_tcp`, one for one, so the kernel takes exactly the frames the core's
// straight line takes and hands every other one to userspace unchanged. The same frame
// with a TCP header of 20 bytes (no options: a client without timestamps) is told apart
// (PLAIN_NO_OPTIONS) for the fallback table's path (fallback.h), and so is one of 24 or 28
// bytes (PLAIN_SHORT_OPTIONS: options, but no room for a timestamp option); the straight
// lines refuse both as they refuse any other layout.

#ifndef CHEETAH_LIB_PARSE_H
#define CHEETAH_LIB_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// The TCP header with NOP NOP TS: 20 + 12 bytes.
#define TCP_WITH_TS_LEN 32
// The options word that starts the straight line's layout: NOP NOP kind=8 len=10.
#define NOP_NOP_TS 0x0101080a
// The frame's bytes up to the end of the timestamp option when the options start NOP NOP TS.
#define PLAIN_HEADERS_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + TCP_WITH_TS_LEN)

// The TCP timestamp option's words when the options start NOP NOP TS: the option sits two
// bytes into the options, TSval four bytes after its start, TSecr eight.
struct nop_nop_ts {
	__u8 nop[2];
	__u8 kind;
	__u8 len;
	__be32 tsval;
	__be32 tsecr;
};

// A frame `plain_ipv4_tcp` accepts: its headers, each proven within the frame.
struct plain_tcp {
	struct ethhdr *eth;
	struct iphdr *ip;
	struct tcphdr *tcp;
	// The first 12 option bytes (the header has room for them); NOP NOP TS only if
	// `plain_has_nop_nop_ts` says so.
	struct nop_nop_ts *ts;
	// Bytes of IP options lifted off the header while the LB decides (ip_options.h): the
	// IP packet is that much longer than ip->tot_len says.
	__u32 ip_options_lifted;
};

// The IP packet's length as it came, options included.
static __always_inline __u32 plain_ip_len(const struct plain_tcp *p)
{
	return bpf_ntohs(p->ip->tot_len) + p->ip_options_lifted;
}

// Why a frame is not the straight line's: only counted, never acted on, so it is found
// only after the check failed.
enum plain_refusal {
	PLAIN_OK,
	PLAIN_NOT_TCP,
	PLAIN_LAYOUT,
	// The plain layout but a TCP header without options: eth, ip and tcp are set, ts is
	// not. Not the straight line's layout (counted as PLAIN_LAYOUT there).
	PLAIN_NO_OPTIONS,
	// The plain layout but a TCP header of 24 or 28 bytes: options too short for NOP NOP
	// TS, or for any timestamp option. eth, ip and tcp are set, ts is not.
	PLAIN_SHORT_OPTIONS,
};

// Whether parse_plain_tcp set eth, ip and tcp: the straight line's layout, or a TCP header
// too short for it (no options, as Linux's RST for a segment it does not know; or options
// with no room for a timestamp), which the core's general path takes. Either way the IP
// and TCP headers are ones the core's checks accept.
static __always_inline int plain_tcp_set(enum plain_refusal refusal)
{
	return refusal == PLAIN_OK || refusal == PLAIN_NO_OPTIONS || refusal == PLAIN_SHORT_OPTIONS;
}

// Fills `view`'s headers if the frame is the straight line's layout (core
// `plain_ipv4_tcp`); its `ip_options_lifted` is the caller's to set.
static __always_inline enum plain_refusal parse_plain_tcp(struct xdp_md *ctx,
							  struct plain_tcp *view)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip + 1);
	__u32 header_len, total_len;

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return PLAIN_LAYOUT;
	if (ip->protocol != IPPROTO_TCP)
		return PLAIN_NOT_TCP;
	// The option-less header first: its frames (54 bytes and up) are shorter than the
	// straight line's (66 and up), which is checked once the data offset says which.
	if ((void *)(tcp + 1) > data_end)
		return PLAIN_LAYOUT;
	// Version 4 without IP options; no fragment (MF clear, offset 0; DF and the reserved
	// bit are not looked at).
	if (*(__u8 *)ip != 0x45 || ip->frag_off & bpf_htons(0x3fff))
		return PLAIN_LAYOUT;
	header_len = tcp->doff * 4;
	total_len = bpf_ntohs(ip->tot_len);
	view->eth = eth;
	view->ip = ip;
	view->tcp = tcp;
	view->ts = NULL;
	if (header_len == sizeof(struct tcphdr)) {
		// IP + TCP <= total_len <= frame.
		if (sizeof(struct iphdr) + sizeof(struct tcphdr) > total_len ||
		    data + sizeof(struct ethhdr) + total_len > data_end)
			return PLAIN_LAYOUT;
		return PLAIN_NO_OPTIONS;
	}
	if (header_len > sizeof(struct tcphdr) && header_len < TCP_WITH_TS_LEN) {
		if (sizeof(struct iphdr) + header_len > total_len ||
		    data + sizeof(struct ethhdr) + total_len > data_end)
			return PLAIN_LAYOUT;
		return PLAIN_SHORT_OPTIONS;
	}
	// IP + TCP_WITH_TS <= IP + header_len <= total_len <= frame: the TCP header with
	// room for NOP NOP TS is within the IP packet, which is within the frame.
	if (data + PLAIN_HEADERS_LEN > data_end || header_len < TCP_WITH_TS_LEN ||
	    sizeof(struct iphdr) + header_len > total_len ||
	    data + sizeof(struct ethhdr) + total_len > data_end)
		return PLAIN_LAYOUT;
	view->ts = (void *)(tcp + 1);
	return PLAIN_OK;
}

// What the core's `Ipv4Packet::new_checked` says of an untagged IPv4 frame's IP header
// (the IP bytes run to the frame's end): IPV4_CHECKED, or its reason to drop the packet,
// in its order. A frame without room for 20 bytes of IP is IPV4_TRUNCATED.
enum ipv4_fault {
	IPV4_CHECKED,
	IPV4_TRUNCATED,
	IPV4_BAD_VERSION,
	IPV4_BAD_HEADER_LENGTH,
	IPV4_BAD_TOTAL_LENGTH,
};

static __always_inline enum ipv4_fault ipv4_header_fault(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u32 ip_len, header_len, total_len;

	if ((void *)(ip + 1) > data_end)
		return IPV4_TRUNCATED;
	if (ip->version != 4)
		return IPV4_BAD_VERSION;
	ip_len = data_end - (void *)ip;
	header_len = ip->ihl * 4;
	if (header_len < sizeof(struct iphdr) || header_len > ip_len)
		return IPV4_BAD_HEADER_LENGTH;
	total_len = bpf_ntohs(ip->tot_len);
	if (total_len < header_len || total_len > ip_len)
		return IPV4_BAD_TOTAL_LENGTH;
	return IPV4_CHECKED;
}

// Whether the frame says, untagged, that it carries IPv4 (its EtherType): the frames
// ipv4_header_fault reads. (Steering also owns tagged frames: their IP header is not here.)
static __always_inline int untagged_ipv4(struct xdp_md *ctx)
{
	struct ethhdr *eth = (void *)(long)ctx->data;

	return (void *)(eth + 1) <= (void *)(long)ctx->data_end &&
	       eth->h_proto == bpf_htons(ETH_P_IP);
}

// Whether an untagged IPv4 frame's IP header is one the core's `Ipv4Packet::new_checked`
// accepts (version 4, header and total length within the frame): the core drops a packet
// to a VIP address by what it carries only then, for any other reason first.
static __always_inline int ipv4_checked(struct xdp_md *ctx)
{
	return untagged_ipv4(ctx) && ipv4_header_fault(ctx) == IPV4_CHECKED;
}

// What the core's `TcpSegment::new_checked` says of the TCP segment an IPv4 frame
// (ipv4_checked) carries, from the end of its IP header to its total length: TCP_CHECKED,
// or its reason to drop the packet.
enum tcp_fault {
	TCP_CHECKED,
	TCP_TRUNCATED,
	TCP_BAD_DATA_OFFSET,
};

static __always_inline enum tcp_fault tcp_header_fault(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct tcphdr *tcp;
	__u32 segment_len, header_len;

	if ((void *)(ip + 1) > data_end)
		return TCP_TRUNCATED; // (not ipv4_checked: not asked)
	segment_len = bpf_ntohs(ip->tot_len) - ip->ihl * 4;
	tcp = (void *)ip + ip->ihl * 4;
	// ipv4_checked: the segment ends within the frame, so a segment of 20 bytes or more
	// holds the whole fixed header; the bound is for the verifier.
	if (segment_len < sizeof(struct tcphdr) || (void *)(tcp + 1) > data_end)
		return TCP_TRUNCATED;
	header_len = tcp->doff * 4;
	if (header_len < sizeof(struct tcphdr) || header_len > segment_len)
		return TCP_BAD_DATA_OFFSET;
	return TCP_CHECKED;
}

// Whether an untagged IPv4 frame (ipv4_checked) is a fragment (MF set or an offset): the
// core drops such a packet to a VIP address as `unsupported_fragment`, whatever it
// carries.
static __always_inline int ipv4_fragment(struct xdp_md *ctx)
{
	struct iphdr *ip = (void *)(long)ctx->data + sizeof(struct ethhdr);

	return ipv4_checked(ctx) && (ip->frag_off & bpf_htons(0x3fff)) != 0;
}

// Whether the TCP options start NOP NOP TS (core fast_path.rs `NOP_NOP_TS`).
static __always_inline int plain_has_nop_nop_ts(const struct plain_tcp *view)
{
	return *(__be32 *)view->ts == bpf_htonl(NOP_NOP_TS);
}

// The SYN and SYN-ACK layouts of the paper's Table 1 (core wire/tcp_options.rs
// `find_timestamp_fast`), as the little-endian loads of the option bytes the core compares:
// value and mask of the first 8 bytes, and for the 12-byte layouts the next 4.
#define SYN_MSS_SACKOK_TS 0x0a08020400000402ull // MSS SAckOK TS
#define SYN_MSS_NOP_NOP_TS 0x0a08010100000402ull // MSS NOP NOP TS
#define SYN_MSS_NOP_WS 0x0003030100000402ull     // MSS NOP WScale, then:
#define SYN_THEN_NOP_NOP_TS 0x0a080101u          //   NOP NOP TS
#define SYN_THEN_SACKOK_TS 0x0a080204u           //   SAckOK TS
#define SYN_MASK_8 0xffffffff0000ffffull
#define SYN_MASK_MSS_NOP_WS 0x00ffffff0000ffffull

// Where a SYN's or SYN-ACK's timestamp option starts within its TCP options if it sits
// where one of Table 1's layouts puts it (6 or 10), else 0: what the core's one wide
// compare finds, so the kernel takes a SYN exactly when the core counts OptionsFastPath.
static __always_inline __u32 syn_timestamp_at(struct xdp_md *ctx, const struct plain_tcp *view)
{
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *options = (__u8 *)view->ts;
	__u32 options_len = view->tcp->doff * 4 - sizeof(struct tcphdr);
	__u64 first;
	__u32 next;

	// parse_plain_tcp put the header within the frame, so this only tells the verifier.
	if ((void *)(options + 12) > data_end || options_len < 16)
		return 0;
	first = *(__u64 *)options;
	if ((first & SYN_MASK_8) == SYN_MSS_SACKOK_TS || (first & SYN_MASK_8) == SYN_MSS_NOP_NOP_TS)
		return 6;
	if (options_len < 20 || (first & SYN_MASK_MSS_NOP_WS) != SYN_MSS_NOP_WS)
		return 0;
	next = *(__u32 *)(options + 8);
	return next == SYN_THEN_NOP_NOP_TS || next == SYN_THEN_SACKOK_TS ? 10 : 0;
}

// The TCP options' most bytes (a data offset of 15 words).
#define TCP_OPTIONS_MAX 40
#define TCP_OPTION_END 0
#define TCP_OPTION_NOP 1
#define TCP_OPTION_TIMESTAMP 8

// The timestamp option's length (kind, length, TSval, TSecr) and where its words sit in it.
#define TCP_TIMESTAMP_LEN 10
#define TCP_TIMESTAMP_TSVAL 2
#define TCP_TIMESTAMP_TSECR 6
// The latest a whole timestamp option can start within the options.
#define TCP_TIMESTAMP_AT_MAX (TCP_OPTIONS_MAX - TCP_TIMESTAMP_LEN)

// What the core's walk (wire/tcp_options.rs `find_timestamp_slow`) says of a segment's
// options besides an offset (>= 0): `Ok(None)`, or the `Err` it drops the segment for, one
// code per DropReason, in the order of the STAT_DROP_* entries they are counted under
// (timestamp_drop_stat). TIMESTAMP_UNWALKED is no answer of the core's: the walk could
// not run (its scratch entry or the options unreadable, which never happens), so the
// caller hands the segment up for the core to decide.
#define TIMESTAMP_NONE (-1)
#define TIMESTAMP_UNWALKED (-2)
#define TIMESTAMP_OPTION_TRUNCATED (-3)   // DropReason::TcpOptionTruncated
#define TIMESTAMP_OPTION_BAD_LENGTH (-4)  // DropReason::TcpOptionBadLength
#define TIMESTAMP_OPTION_OVERRUN (-5)     // DropReason::TcpOptionOverrun
#define TIMESTAMP_BAD_LENGTH (-6)         // DropReason::BadTimestampOptionLength

// Whether the walk's answer is one the core drops the segment for.
static __always_inline int timestamp_malformed(int found)
{
	return found <= TIMESTAMP_OPTION_TRUNCATED && found >= TIMESTAMP_BAD_LENGTH;
}

// The state of timestamp_walk (one bpf_loop step per option).
struct option_walk {
	__u8 options[TCP_OPTIONS_MAX];
	__u32 len;
	__u32 at;
	// Set by the step that ends the walk: an offset, TIMESTAMP_NONE or a malformed code.
	int found;
};

// The walk's state lives in a per-CPU scratch entry, not on the stack: inlined at each of
// its call sites, its 52 bytes would come out of the program's 512-byte frame, which the
// straight lines already nearly fill. Per packet, nothing to keep: not pinned (pin.rs).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct option_walk);
} option_walk_scratch SEC(".maps");

// One option of the core's TLV walk: 0 to go on, 1 to stop with `found` set. The context
// is the caller's pointer to the scratch entry (bpf_loop's context must be on the stack).
static long option_walk_step(__u32 i, void *context)
{
	struct option_walk *walk = *(struct option_walk **)context;
	__u32 at = walk->at, len;
	__u8 kind;

	if (at >= walk->len || at >= TCP_OPTIONS_MAX) {
		walk->found = TIMESTAMP_NONE;
		return 1;
	}
	kind = walk->options[at];
	if (kind == TCP_OPTION_END) {
		walk->found = TIMESTAMP_NONE;
		return 1;
	}
	if (kind == TCP_OPTION_NOP) {
		walk->at = at + 1;
		return 0;
	}
	// Truncated, a bad length, an overrun, a timestamp of another length: the core drops,
	// each for its own reason, checked in the core's order.
	walk->found = TIMESTAMP_OPTION_TRUNCATED;
	if (at + 1 >= walk->len || at + 1 >= TCP_OPTIONS_MAX)
		return 1;
	len = walk->options[at + 1];
	walk->found = TIMESTAMP_OPTION_BAD_LENGTH;
	if (len < 2)
		return 1;
	walk->found = TIMESTAMP_OPTION_OVERRUN;
	if (at + len > walk->len)
		return 1;
	if (kind == TCP_OPTION_TIMESTAMP) {
		walk->found = len == TCP_TIMESTAMP_LEN ? (int)at : TIMESTAMP_BAD_LENGTH;
		return 1;
	}
	walk->at = at + len;
	return 0;
}

// The core's walk over the options of the TCP header at `tcp`, which the caller proved
// within the frame and within its IP packet, options included: the offset of the first
// timestamp option within the options (at most TCP_TIMESTAMP_AT_MAX), TIMESTAMP_NONE, a
// malformed code (the core drops), or TIMESTAMP_UNWALKED. A bpf_loop over a copy of the
// options, so the verifier walks one step, not forty.
static __always_inline int tcp_timestamp_walk(struct xdp_md *ctx, const struct tcphdr *tcp)
{
	__u32 offset = (void *)(tcp + 1) - (void *)(long)ctx->data;
	__u32 len = tcp->doff * 4 - sizeof(struct tcphdr);
	struct option_walk *walk;
	__u32 zero = 0;

	// The callers proved 4 <= len <= 40 and the options within the frame.
	if (len == 0 || len > TCP_OPTIONS_MAX)
		return TIMESTAMP_UNWALKED;
	walk = bpf_map_lookup_elem(&option_walk_scratch, &zero);
	if (!walk)
		return TIMESTAMP_UNWALKED;
	walk->len = len;
	walk->at = 0;
	walk->found = TIMESTAMP_UNWALKED;
	if (bpf_xdp_load_bytes(ctx, offset, walk->options, len))
		return TIMESTAMP_UNWALKED;
	// Each step moves on by a byte at least: as many steps as bytes end the walk.
	bpf_loop(TCP_OPTIONS_MAX + 1, option_walk_step, &walk, 0);
	return walk->found;
}

// The walk over the options of `view` (the straight line's layout, PLAIN_OK, or
// PLAIN_SHORT_OPTIONS). The one rule for every segment whose timestamp is not where the
// wide compares look (plain_has_nop_nop_ts, syn_timestamp_at); only those pay for it.
static __always_inline int timestamp_walk(struct xdp_md *ctx, const struct plain_tcp *view)
{
	return tcp_timestamp_walk(ctx, view->tcp);
}

// The timestamp option that the walk found at `at` within the options at `options` (12
// bytes of them proven within the frame), proven within the frame for the verifier; NULL
// if it is not (it always is: the walk read it from there).
static __always_inline __u8 *tcp_timestamp_option_at(struct xdp_md *ctx, __u8 *options, int at)
{
	__u8 *option;
	__u32 offset;

	if (at < 0 || at > TCP_TIMESTAMP_AT_MAX)
		return NULL;
	// The mask proves the bound again on the register the add uses: clang may check one
	// copy of `at` and add another, whose bounds the verifier never learnt.
	offset = at;
	asm volatile("" : "+r"(offset));
	option = options + (offset & 0x1f);
	if ((void *)(option + TCP_TIMESTAMP_LEN) > (void *)(long)ctx->data_end)
		return NULL;
	return option;
}

// The same within the options of `view`.
static __always_inline __u8 *timestamp_option_at(struct xdp_md *ctx, const struct plain_tcp *view,
						 int at)
{
	return tcp_timestamp_option_at(ctx, (__u8 *)view->ts, at);
}

// The TCP flags byte (CWR ECE URG ACK PSH RST SYN FIN).
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

static __always_inline __u8 tcp_flags(const struct tcphdr *tcp)
{
	return ((const __u8 *)tcp)[13];
}

#endif
