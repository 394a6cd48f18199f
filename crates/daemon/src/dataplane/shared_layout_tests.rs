//! Holds the Rust side of `bpf/include/cheetah_shared.h` equal to the C side: compiles a
//! host program that prints each constant, size and field offset of the header as C sees
//! it, and compares them with the Rust items that mirror them. Every name the header
//! defines must be checked here, so neither side can change, nor the header grow, unseen.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use super::meta::{RawMeta, FIB_NO_NEIGH, FIB_OK, FROM_SERVER, MAGIC, META_LEN, TO_VIP};
use super::xdp::{
    MAX_HOST_ADDRS, MAX_INTERFACES, MAX_QUEUES, STAT_NO_METADATA_ROOM, STAT_NO_SOCKET, STAT_PASSED,
    STAT_TO_SOCKET,
};
use super::xdp_layout::*;
use super::xdp_tables::NO_VIP;
use cheetah_core::cookie::msb::{self, ClockWords, BEYOND_IDLE_LIMIT, COOKIES, KNOWN};
use cheetah_core::lb::fallback;
use cheetah_core::types::ServerId;

const HEADER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../bpf/include/cheetah_shared.h"
);

/// Names of the header with no Rust counterpart, and why none is needed.
const C_ONLY: &[(&str, &str)] = &[
    ("CHEETAH_SHARED_H", "the include guard"),
    (
        "META_FIB_FAILED",
        "userspace takes every next hop that is neither FIB_OK nor FIB_NO_NEIGH as unroutable",
    ),
];

fn field_size<S, F>(_field: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

/// C expression -> the value the Rust side has for it.
fn rust_side() -> BTreeMap<String, u64> {
    let stats = [
        STAT_TO_SOCKET,
        STAT_NO_SOCKET,
        STAT_PASSED,
        STAT_NO_METADATA_ROOM,
    ];
    let values: Vec<(&str, usize)> = vec![
        ("MAX_QUEUES", MAX_QUEUES as usize),
        ("MAX_INTERFACES", MAX_INTERFACES),
        ("SERVER_SIDE_SLOTS", SERVER_SIDE_SLOTS),
        ("MAX_HOST_ADDRS", MAX_HOST_ADDRS),
        ("META_MAGIC", MAGIC as usize),
        ("META_TO_VIP", TO_VIP as usize),
        ("META_FROM_SERVER", FROM_SERVER as usize),
        ("META_FIB_OK", FIB_OK as usize),
        ("META_FIB_NO_NEIGH", FIB_NO_NEIGH as usize),
        ("sizeof(struct cheetah_meta)", META_LEN),
        (
            "offsetof(struct cheetah_meta, magic)",
            offset_of!(RawMeta, magic),
        ),
        (
            "offsetof(struct cheetah_meta, flags)",
            offset_of!(RawMeta, flags),
        ),
        (
            "offsetof(struct cheetah_meta, ifindex)",
            offset_of!(RawMeta, ifindex),
        ),
        (
            "offsetof(struct cheetah_meta, dmac)",
            offset_of!(RawMeta, dmac),
        ),
        (
            "offsetof(struct cheetah_meta, smac)",
            offset_of!(RawMeta, smac),
        ),
        (
            "fieldsize(struct cheetah_meta, magic)",
            field_size(|m: &RawMeta| &m.magic),
        ),
        (
            "fieldsize(struct cheetah_meta, flags)",
            field_size(|m: &RawMeta| &m.flags),
        ),
        (
            "fieldsize(struct cheetah_meta, ifindex)",
            field_size(|m: &RawMeta| &m.ifindex),
        ),
        (
            "fieldsize(struct cheetah_meta, dmac)",
            field_size(|m: &RawMeta| &m.dmac),
        ),
        (
            "fieldsize(struct cheetah_meta, smac)",
            field_size(|m: &RawMeta| &m.smac),
        ),
        ("STAT_TO_SOCKET", STAT_TO_SOCKET as usize),
        ("STAT_NO_SOCKET", STAT_NO_SOCKET as usize),
        ("STAT_PASSED", STAT_PASSED as usize),
        ("STAT_NO_METADATA_ROOM", STAT_NO_METADATA_ROOM as usize),
        ("STAT_FAST_CLIENT_COOKIE", STAT_FAST_CLIENT_COOKIE as usize),
        ("STAT_FAST_CLIENT_PICK", STAT_FAST_CLIENT_PICK as usize),
        ("STAT_FAST_SERVER_COOKIE", STAT_FAST_SERVER_COOKIE as usize),
        ("STAT_FAST_SERVER_PLAIN", STAT_FAST_SERVER_PLAIN as usize),
        ("STAT_UP_NEW_CONNECTION", STAT_UP_NEW_CONNECTION as usize),
        ("STAT_UP_LAYOUT", STAT_UP_LAYOUT as usize),
        ("STAT_UP_COOKIE", STAT_UP_COOKIE as usize),
        ("STAT_UP_CLOCK", STAT_UP_CLOCK as usize),
        (
            "STAT_UP_HANDSHAKE_OR_CLOSE",
            STAT_UP_HANDSHAKE_OR_CLOSE as usize,
        ),
        ("STAT_UP_NEXT_HOP", STAT_UP_NEXT_HOP as usize),
        ("STAT_UP_OTHER", STAT_UP_OTHER as usize),
        ("STAT_NEXT_HOP_MISS", STAT_NEXT_HOP_MISS as usize),
        ("STAT_UP_PUBLISHING", STAT_UP_PUBLISHING as usize),
        ("STAT_FAST_CLIENT_SYN", STAT_FAST_CLIENT_SYN as usize),
        (
            "STAT_FAST_CLIENT_SYN_RETRANSMITTED",
            STAT_FAST_CLIENT_SYN_RETRANSMITTED as usize,
        ),
        ("KERNEL_POLICY_NONE", KERNEL_POLICY_NONE as usize),
        ("KERNEL_POLICY_RR", KERNEL_POLICY_RR as usize),
        ("KERNEL_POLICY_WRR", KERNEL_POLICY_WRR as usize),
        ("KERNEL_POLICY_RANDOM", KERNEL_POLICY_RANDOM as usize),
        ("KERNEL_POLICY_HASH", KERNEL_POLICY_HASH as usize),
        ("KERNEL_POLICY_POW2", KERNEL_POLICY_POW2 as usize),
        ("KERNEL_POLICY_AWRR", KERNEL_POLICY_AWRR as usize),
        ("KERNEL_POLICY_MAGLEV", KERNEL_POLICY_MAGLEV as usize),
        ("KERNEL_POLICY_EMPTY", KERNEL_POLICY_EMPTY as usize),
        ("SCHEDULE_CAP", SCHEDULE_CAP),
        ("SCHEDULE_CHUNKS", SCHEDULE_CHUNKS),
        ("SCHEDULE_MAX_LEN", SCHEDULE_MAX_LEN),
        ("SCHEDULE_CHUNK_BUDGET", SCHEDULE_CHUNK_BUDGET),
        ("LOAD_METRIC_ACTIVE", LOAD_METRIC_ACTIVE as usize),
        ("LOAD_METRIC_REPORTED", LOAD_METRIC_REPORTED as usize),
        (
            "KERNEL_POLICY_LEAST_LOADED",
            KERNEL_POLICY_LEAST_LOADED as usize,
        ),
        ("LOAD_METRIC_PACKETS", LOAD_METRIC_PACKETS as usize),
        ("LOAD_METRIC_BYTES", LOAD_METRIC_BYTES as usize),
        ("LOAD_METRICS", LOAD_METRICS),
        ("HANDSHAKE_SLOTS", HANDSHAKE_SLOTS),
        ("HANDSHAKE_RETRY_SLOTS", HANDSHAKE_RETRY_SLOTS),
        ("STAT_FAST_SERVER_CLOSE", STAT_FAST_SERVER_CLOSE as usize),
        (
            "STAT_FAST_SERVER_DUPLICATE_CLOSE",
            STAT_FAST_SERVER_DUPLICATE_CLOSE as usize,
        ),
        ("STAT_FAST_ICMP_COOKIE", STAT_FAST_ICMP_COOKIE as usize),
        ("STAT_FAST_ICMP_PICK", STAT_FAST_ICMP_PICK as usize),
        ("STAT_UP_ICMP", STAT_UP_ICMP as usize),
        (
            "STAT_FAST_CLIENT_FALLBACK",
            STAT_FAST_CLIENT_FALLBACK as usize,
        ),
        ("STAT_UP_FALLBACK_MISS", STAT_UP_FALLBACK_MISS as usize),
        ("STAT_REPLY_BY_STEERING", STAT_REPLY_BY_STEERING as usize),
        (
            "STAT_NEXT_HOP_CACHE_MISS",
            STAT_NEXT_HOP_CACHE_MISS as usize,
        ),
        (
            "STAT_FAST_SERVER_COOKIE_LEARNED",
            STAT_FAST_SERVER_COOKIE_LEARNED as usize,
        ),
        (
            "STAT_FAST_SERVER_COOKIE_ADVANCED",
            STAT_FAST_SERVER_COOKIE_ADVANCED as usize,
        ),
        (
            "STAT_FAST_SERVER_CLOSE_LEARNED",
            STAT_FAST_SERVER_CLOSE_LEARNED as usize,
        ),
        (
            "STAT_FAST_SERVER_CLOSE_ADVANCED",
            STAT_FAST_SERVER_CLOSE_ADVANCED as usize,
        ),
        (
            "STAT_FAST_SERVER_DUPLICATE_CLOSE_LEARNED",
            STAT_FAST_SERVER_DUPLICATE_CLOSE_LEARNED as usize,
        ),
        (
            "STAT_FAST_SERVER_DUPLICATE_CLOSE_ADVANCED",
            STAT_FAST_SERVER_DUPLICATE_CLOSE_ADVANCED as usize,
        ),
        ("STAT_FAST_FALLBACK_SYN", STAT_FAST_FALLBACK_SYN as usize),
        (
            "STAT_FAST_FALLBACK_SYN_EVICTED",
            STAT_FAST_FALLBACK_SYN_EVICTED as usize,
        ),
        (
            "STAT_FAST_FALLBACK_SYN_RETRANSMITTED",
            STAT_FAST_FALLBACK_SYN_RETRANSMITTED as usize,
        ),
        (
            "STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED",
            STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED as usize,
        ),
        ("STAT_FAST_FALLBACK_MISS", STAT_FAST_FALLBACK_MISS as usize),
        (
            "STAT_FAST_SERVER_FALLBACK_LEARNED",
            STAT_FAST_SERVER_FALLBACK_LEARNED as usize,
        ),
        (
            "STAT_FAST_SERVER_FALLBACK_LEARNED_EVICTED",
            STAT_FAST_SERVER_FALLBACK_LEARNED_EVICTED as usize,
        ),
        (
            "STAT_FAST_SERVER_COOKIE_MOVED_RETIRED",
            STAT_FAST_SERVER_COOKIE_MOVED_RETIRED as usize,
        ),
        (
            "STAT_FAST_CLIENT_COOKIE_WALKED",
            STAT_FAST_CLIENT_COOKIE_WALKED as usize,
        ),
        ("STAT_OPTIONS_WALKED", STAT_OPTIONS_WALKED as usize),
        (
            "STAT_FAST_CLIENT_PICK_GENERAL",
            STAT_FAST_CLIENT_PICK_GENERAL as usize,
        ),
        (
            "STAT_FAST_SERVER_NO_TIMESTAMP",
            STAT_FAST_SERVER_NO_TIMESTAMP as usize,
        ),
        (
            "STAT_FAST_SERVER_RESET_NO_TIMESTAMP",
            STAT_FAST_SERVER_RESET_NO_TIMESTAMP as usize,
        ),
        (
            "STAT_FAST_SERVER_NO_TIMESTAMP_GENERAL",
            STAT_FAST_SERVER_NO_TIMESTAMP_GENERAL as usize,
        ),
        (
            "STAT_FAST_SERVER_RESET_NO_TIMESTAMP_GENERAL",
            STAT_FAST_SERVER_RESET_NO_TIMESTAMP_GENERAL as usize,
        ),
        (
            "STAT_FAST_SERVER_PLAIN_GENERAL",
            STAT_FAST_SERVER_PLAIN_GENERAL as usize,
        ),
        (
            "STAT_DROP_TCP_OPTION_TRUNCATED",
            STAT_DROP_TCP_OPTION_TRUNCATED as usize,
        ),
        (
            "STAT_DROP_TCP_OPTION_BAD_LENGTH",
            STAT_DROP_TCP_OPTION_BAD_LENGTH as usize,
        ),
        (
            "STAT_DROP_TCP_OPTION_OVERRUN",
            STAT_DROP_TCP_OPTION_OVERRUN as usize,
        ),
        (
            "STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH",
            STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH as usize,
        ),
        (
            "STAT_DROP_SERVER_TCP_OPTION_TRUNCATED",
            STAT_DROP_SERVER_TCP_OPTION_TRUNCATED as usize,
        ),
        (
            "STAT_DROP_SERVER_TCP_OPTION_BAD_LENGTH",
            STAT_DROP_SERVER_TCP_OPTION_BAD_LENGTH as usize,
        ),
        (
            "STAT_DROP_SERVER_TCP_OPTION_OVERRUN",
            STAT_DROP_SERVER_TCP_OPTION_OVERRUN as usize,
        ),
        (
            "STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH",
            STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH as usize,
        ),
        (
            "STAT_DROP_UNSUPPORTED_FRAGMENT",
            STAT_DROP_UNSUPPORTED_FRAGMENT as usize,
        ),
        (
            "STAT_DROP_UNSUPPORTED_UDP",
            STAT_DROP_UNSUPPORTED_UDP as usize,
        ),
        (
            "STAT_DROP_UNSUPPORTED_PROTOCOL",
            STAT_DROP_UNSUPPORTED_PROTOCOL as usize,
        ),
        (
            "STAT_DROP_VIP_PORT_UNKNOWN",
            STAT_DROP_VIP_PORT_UNKNOWN as usize,
        ),
        (
            "STAT_DROP_SERVER_REMOVED",
            STAT_DROP_SERVER_REMOVED as usize,
        ),
        (
            "STAT_DROP_UNKNOWN_SERVER_SOURCE",
            STAT_DROP_UNKNOWN_SERVER_SOURCE as usize,
        ),
        (
            "STAT_DROP_SERVER_REMOVED_GENERAL",
            STAT_DROP_SERVER_REMOVED_GENERAL as usize,
        ),
        (
            "STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE",
            STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE as usize,
        ),
        (
            "STAT_FAST_SERVER_NO_TIMESTAMP_DUPLICATE_CLOSE",
            STAT_FAST_SERVER_NO_TIMESTAMP_DUPLICATE_CLOSE as usize,
        ),
        ("STAT_GENERAL_PATH", STAT_GENERAL_PATH as usize),
        (
            "STAT_DROP_REPLY_FROM_CLIENT_SIDE",
            STAT_DROP_REPLY_FROM_CLIENT_SIDE as usize,
        ),
        ("BACKEND_NO_VIP", NO_VIP as usize),
        ("BACKEND_DIP_OF_REMOVED", BACKEND_DIP_OF_REMOVED as usize),
        ("VIP_ADDR_DIP_OF_REMOVED", VIP_ADDR_DIP_OF_REMOVED as usize),
        (
            "STAT_DROP_COOKIE_UNKNOWN_SERVER",
            STAT_DROP_COOKIE_UNKNOWN_SERVER as usize,
        ),
        (
            "STAT_DROP_COOKIE_SERVER_REMOVED",
            STAT_DROP_COOKIE_SERVER_REMOVED as usize,
        ),
        (
            "STAT_DROP_TS_MSB_UNKNOWN",
            STAT_DROP_TS_MSB_UNKNOWN as usize,
        ),
        (
            "STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER",
            STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER as usize,
        ),
        (
            "STAT_DROP_ICMP_COOKIE_SERVER_REMOVED",
            STAT_DROP_ICMP_COOKIE_SERVER_REMOVED as usize,
        ),
        (
            "STAT_ECHO_BEYOND_IDLE_LIMIT",
            STAT_ECHO_BEYOND_IDLE_LIMIT as usize,
        ),
        (
            "STAT_DROP_BAD_IP_VERSION",
            STAT_DROP_BAD_IP_VERSION as usize,
        ),
        (
            "STAT_DROP_BAD_IPV4_HEADER_LENGTH",
            STAT_DROP_BAD_IPV4_HEADER_LENGTH as usize,
        ),
        (
            "STAT_DROP_BAD_IPV4_TOTAL_LENGTH",
            STAT_DROP_BAD_IPV4_TOTAL_LENGTH as usize,
        ),
        ("STAT_DROP_TRUNCATED_TCP", STAT_DROP_TRUNCATED_TCP as usize),
        (
            "STAT_DROP_BAD_TCP_DATA_OFFSET",
            STAT_DROP_BAD_TCP_DATA_OFFSET as usize,
        ),
        (
            "STAT_DROP_FALLBACK_SERVER_REMOVED",
            STAT_DROP_FALLBACK_SERVER_REMOVED as usize,
        ),
        (
            "STAT_FAST_SERVER_COOKIE_UNSTABLE",
            STAT_FAST_SERVER_COOKIE_UNSTABLE as usize,
        ),
        (
            "STAT_FAST_SERVER_COOKIE_AHEAD",
            STAT_FAST_SERVER_COOKIE_AHEAD as usize,
        ),
        (
            "STAT_FAST_SERVER_CLOSE_UNSTABLE",
            STAT_FAST_SERVER_CLOSE_UNSTABLE as usize,
        ),
        (
            "STAT_FAST_SERVER_CLOSE_AHEAD",
            STAT_FAST_SERVER_CLOSE_AHEAD as usize,
        ),
        (
            "STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE",
            STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE as usize,
        ),
        (
            "STAT_FAST_SERVER_DUPLICATE_CLOSE_AHEAD",
            STAT_FAST_SERVER_DUPLICATE_CLOSE_AHEAD as usize,
        ),
        (
            "STAT_DROP_TRUNCATED_ICMP",
            STAT_DROP_TRUNCATED_ICMP as usize,
        ),
        (
            "STAT_DROP_UNSUPPORTED_ICMP_TYPE",
            STAT_DROP_UNSUPPORTED_ICMP_TYPE as usize,
        ),
        (
            "STAT_FAST_SERVER_NOT_TCP",
            STAT_FAST_SERVER_NOT_TCP as usize,
        ),
        ("STAT_FAST_ICMP_FALLBACK", STAT_FAST_ICMP_FALLBACK as usize),
        ("STAT_ANSWER_MOVED", STAT_ANSWER_MOVED as usize),
        ("STAT_OPTIONS_COMPARED", STAT_OPTIONS_COMPARED as usize),
        (
            "STAT_DROP_NO_SERVER_AVAILABLE_SYN",
            STAT_DROP_NO_SERVER_AVAILABLE_SYN as usize,
        ),
        (
            "STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN",
            STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN as usize,
        ),
        (
            "STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS",
            STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS as usize,
        ),
        (
            "STAT_DROP_NO_SERVER_AVAILABLE_PICK",
            STAT_DROP_NO_SERVER_AVAILABLE_PICK as usize,
        ),
        (
            "STAT_DROP_NO_SERVER_AVAILABLE",
            STAT_DROP_NO_SERVER_AVAILABLE as usize,
        ),
        ("MAGLEV_CHUNK_SLOTS", MAGLEV_CHUNK_SLOTS),
        ("MAGLEV_NO_SERVER", MAGLEV_NO_SERVER as usize),
        (
            "STAT_COUNT",
            // The event counters: STAT_NEXT_HOP_MISS, STAT_REPLY_BY_STEERING,
            // STAT_NEXT_HOP_CACHE_MISS, STAT_OPTIONS_WALKED, STAT_GENERAL_PATH,
            // STAT_ECHO_BEYOND_IDLE_LIMIT and STAT_OPTIONS_COMPARED.
            stats.len() + FAST_BUNDLES.len() + UP_REASONS.len() + 7 + FAST_EVENTS.len(),
        ),
        ("STAT_SLOTS", STAT_SLOTS as usize),
        ("CHEETAH_PIN_LAYOUT", PIN_LAYOUT as usize),
        ("PUBLISH_COPIES", PUBLISH_COPIES),
        ("CLOSE_SLOTS", CLOSE_SLOTS),
        ("MAX_NEXT_HOPS", MAX_NEXT_HOPS),
        ("NEXT_HOP_FIB", NEXT_HOP_FIB as usize),
        ("NEXT_HOP_KNOWN", NEXT_HOP_KNOWN as usize),
        ("NEXT_HOP_ON_LINK", NEXT_HOP_ON_LINK as usize),
        ("SERVER_ID_SPACE", SERVER_ID_SPACE),
        ("COOKIE_SPACE", COOKIE_SPACE),
        ("MAX_VIPS", MAX_VIPS),
        ("MAX_HASH_POOL", MAX_HASH_POOL),
        ("MAX_BIG_POOL", MAX_BIG_POOL),
        ("REPLY_SLOT_BITS", REPLY_SLOT_BITS as usize),
        ("REPLY_SLOTS", REPLY_SLOTS),
        ("REPLY_SLOT_MULTIPLIER", REPLY_SLOT_MULTIPLIER as usize),
        ("VIP_SLOT_BITS", VIP_SLOT_BITS as usize),
        ("VIP_SLOTS", VIP_SLOTS),
        ("VIP_SLOT_MULTIPLIER", VIP_SLOT_MULTIPLIER as usize),
        ("VIP_SLOT_USED", VIP_SLOT_USED as usize),
        ("LB_FAST_PATH", LB_FAST_PATH as usize),
        ("LB_EVERY_VIP", LB_EVERY_VIP as usize),
        ("LB_MODE_CHEETAH", LB_MODE_CHEETAH as usize),
        ("LB_MODE_HASH", LB_MODE_HASH as usize),
        ("LB_MODE_MAGLEV", LB_MODE_MAGLEV as usize),
        ("LB_FORWARDING_L2", LB_FORWARDING_L2 as usize),
        ("LB_FORWARDING_NAT", LB_FORWARDING_NAT as usize),
        ("SERVER_FORWARDS", SERVER_FORWARDS as usize),
        ("SERVER_EGRESS", SERVER_EGRESS as usize),
        ("SERVER_REMOVED", SERVER_REMOVED as usize),
        // The kernel reads the core's clock words as they are: the flags are the core's.
        ("MSB_KNOWN", KNOWN as usize),
        ("MSB_BEYOND_IDLE_LIMIT", BEYOND_IDLE_LIMIT as usize),
        // The kernel learns a reply's clock by the core's rules, in its words.
        ("MSB_GENERATION_ONE", msb::GENERATION_ONE as usize),
        ("MSB_UNKNOWN_ANCHOR", msb::UNKNOWN as usize),
        (
            "MSB_MAX_TICKS_PER_MINUTE",
            msb::MAX_TICKS_PER_MINUTE as usize,
        ),
        ("MSB_TICK_SLACK", msb::TICK_SLACK as usize),
        (
            "MSB_DRIFT_ALLOWANCE_SHIFT",
            msb::DRIFT_ALLOWANCE_SHIFT as usize,
        ),
        ("FALLBACK_WAYS", FALLBACK_WAYS),
    ];
    // The kernel's fallback sets are the core's.
    assert_eq!(FALLBACK_WAYS, fallback::WAYS);
    assert_eq!(size_of::<FallbackSet>(), fallback::SET_BYTES);
    // Sizes the core's clock table and the kernel's arrays must share.
    assert_eq!(SERVER_ID_SPACE, ServerId::SPACE);
    assert_eq!(COOKIE_SPACE, COOKIES);
    // The kernel's handshake table is the core's default one.
    assert_eq!(HANDSHAKE_SLOTS, cheetah_core::lb::handshakes::DEFAULT_SLOTS);
    assert_eq!(
        HANDSHAKE_RETRY_SLOTS,
        cheetah_core::lb::handshakes::RETRY_SLOTS
    );
    assert_eq!(CLOSE_SLOTS, cheetah_core::lb::closes::DEFAULT_SLOTS);
    let mut values: Vec<(String, usize)> = values
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    values.extend(layout!(BackendKey, "struct backend_key", addr, port, copy));
    values.extend(layout!(
        BackendInfo,
        "struct backend_info",
        server,
        vip_index,
        flags
    ));
    values.extend(layout!(
        LbConfigValue,
        "struct lb_config",
        flags,
        mode,
        forwarding,
        id_bits,
        copy,
        id_mask,
        pad2,
        generation,
        publish_seq,
        fallback_mask,
        maglev_size,
        clock_base_ns,
        vip_addr_filter
    ));
    values.extend(layout!(FallbackSet, "struct fallback_set", way));
    values.extend(layout!(MaglevChunk, "struct maglev_chunk", server));
    values.extend(layout!(
        VipKey,
        "struct vip_key",
        addr,
        port,
        protocol,
        copy
    ));
    values.extend(layout!(
        VipInfo,
        "struct vip_info",
        hash_prefix,
        addr,
        port,
        backend_port,
        index,
        pool_len,
        pool,
        policy,
        load_metric,
        pad
    ));
    values.extend(layout!(
        ServerInfo,
        "struct server_info",
        flags,
        dip,
        egress_ifindex,
        dst_mac,
        src_mac
    ));
    values.extend(layout!(MacKey, "struct mac_key", mac, copy));
    values.extend(layout!(ReplyKey, "struct reply_key", addr, port, mac));
    values.extend(layout!(
        ReplySlot,
        "struct reply_slot",
        key,
        used,
        sender,
        pad
    ));
    values.extend(layout!(
        VipSlot,
        "struct vip_slot",
        tag,
        hash_prefix,
        port,
        backend_port,
        pad,
        pad2
    ));
    values.extend(layout!(
        ReplySender,
        "struct reply_sender",
        hash_prefix,
        vip_addr,
        vip_port,
        server
    ));
    values.extend(layout!(
        NextHopKey,
        "struct next_hop_key",
        prefixlen,
        copy,
        addr
    ));
    values.extend(layout!(AddrKey, "struct vip_addr_key", addr, copy));
    values.extend(layout!(AddrKey, "struct next_hop_host_key", addr, copy));
    values.extend(layout!(
        NextHop,
        "struct next_hop",
        kind,
        ifindex,
        mtu,
        dmac,
        smac
    ));
    values.extend(layout!(
        ServerTraffic,
        "struct server_traffic",
        packets,
        bytes,
        opened,
        closed,
        moved_in,
        pad
    ));
    values.extend(layout!(VipWeights, "struct vip_weights", total, weight));
    values.extend(layout!(VipSchedule, "struct vip_schedule", len, position));
    values.extend(layout!(
        ScheduleChunkKey,
        "struct schedule_chunk_key",
        index,
        chunk,
        copy
    ));
    values.extend(layout!(ScheduleChunk, "struct schedule_chunk", position));
    values.extend(layout!(VipBigPool, "struct vip_big_pool", id));
    values.extend(layout!(
        PolicyState,
        "struct policy_state",
        rr_position,
        schedule_cursor,
        wrr_steps,
        wrr_base
    ));
    values.extend(layout!(PolicyRngState, "struct policy_rng", s));
    values.extend(layout!(
        HandshakeWords,
        "struct handshake_words",
        slot,
        retry
    ));
    values.extend(layout!(ActiveLoad, "struct active_load", base, own));
    values.extend(layout!(ActiveRow, "struct active_row", server));
    values.extend(layout!(PublishedRow, "struct published_row", server));
    values.extend(layout!(CloseWords, "struct close_words", word));
    values.extend(layout!(
        ClockWords,
        "struct msb_clock_words",
        anchors,
        limits,
        estimates,
        probed,
        writes
    ));
    values
        .into_iter()
        .map(|(name, value)| (name, value as u64))
        .collect()
}

/// The size of a Rust struct and the offset and size of each field, named as the C
/// expressions [`declared`] lists for the C struct.
macro_rules! layout {
    ($rust:ty, $c:literal, $($field:ident),+) => {{
        let mut values = vec![(format!("sizeof({})", $c), size_of::<$rust>())];
        $(
            values.push((
                format!("offsetof({}, {})", $c, stringify!($field)),
                offset_of!($rust, $field),
            ));
            values.push((
                format!("fieldsize({}, {})", $c, stringify!($field)),
                field_size(|s: &$rust| &s.$field),
            ));
        )+
        values
    }};
}
use layout;

/// What the header declares, as the C expressions that must be checked: each `#define`,
/// each enum member, and each struct's size and its fields' offsets and sizes.
fn declared(header: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside: Option<String> = None;
    for line in header.lines() {
        let code = line.split("//").next().unwrap().trim();
        if let Some(define) = code.strip_prefix("#define ") {
            names.push(define.split_whitespace().next().unwrap().to_string());
        } else if let Some(open) = code.strip_suffix('{') {
            let open = open.trim();
            if open.starts_with("struct ") {
                names.push(format!("sizeof({open})"));
            }
            inside = Some(open.to_string());
        } else if code.starts_with('}') {
            inside = None;
        } else if let (Some(block), false) = (&inside, code.is_empty()) {
            if block.starts_with("enum ") {
                names.push(code.trim_end_matches(',').trim().to_string());
            } else {
                let declarator = code
                    .trim_end_matches(';')
                    .split_whitespace()
                    .last()
                    .unwrap();
                let field = declarator.split('[').next().unwrap();
                names.push(format!("offsetof({block}, {field})"));
                names.push(format!("fieldsize({block}, {field})"));
            }
        }
    }
    names
}

/// Compiles a host program against the header and returns what it prints for each name.
fn c_side(names: &[String]) -> BTreeMap<String, u64> {
    let dir = tempfile::tempdir().unwrap();
    let include = Path::new(HEADER).parent().unwrap();
    let mut program = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"cheetah_shared.h\"\n\
         #define fieldsize(type, field) sizeof(((type *)0)->field)\n\
         int main(void)\n{\n",
    );
    for name in names {
        program +=
            &format!("\tprintf(\"%s\\t%llu\\n\", \"{name}\", (unsigned long long)({name}));\n");
    }
    program += "\treturn 0;\n}\n";
    let source = dir.path().join("layout.c");
    let binary = dir.path().join("layout");
    std::fs::write(&source, program).unwrap();
    // The C compiler scripts/setup.sh installs (build-essential).
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let compiled = Command::new(&cc)
        .args(["-Wall", "-Werror", "-I"])
        .arg(include)
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc} ({e}); run scripts/setup.sh"));
    assert!(
        compiled.status.success(),
        "{cc} cannot build a program with {HEADER}:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&binary).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once('\t').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn c_and_rust_agree_on_the_shared_layouts() {
    let header = std::fs::read_to_string(HEADER).unwrap();
    let rust = rust_side();
    let names: Vec<String> = declared(&header)
        .into_iter()
        .filter(|name| !C_ONLY.iter().any(|(c_only, _)| c_only == name))
        .collect();
    let unmirrored: Vec<&String> = names.iter().filter(|n| !rust.contains_key(*n)).collect();
    assert!(
        unmirrored.is_empty(),
        "{HEADER} declares {unmirrored:?}, which no Rust item mirrors: add them to rust_side \
         (or to C_ONLY, saying why userspace needs none)"
    );
    let stale: Vec<&String> = rust.keys().filter(|n| !names.contains(n)).collect();
    assert!(stale.is_empty(), "{HEADER} no longer declares {stale:?}");
    let c = c_side(&names);
    let disagreements: Vec<String> = names
        .iter()
        .filter(|name| c.get(*name) != rust.get(*name))
        .map(|name| format!("{name}: C {:?}, Rust {:?}", c.get(name), rust.get(name)))
        .collect();
    assert!(
        disagreements.is_empty(),
        "C and Rust disagree:\n{}",
        disagreements.join("\n")
    );
}
