//! The Rust side of the maps the XDP program (`bpf/xdp_lb.c`) reads: limits, flags,
//! counter indices, and each key and value of `bpf/include/cheetah_shared.h` as a
//! `#[repr(C)]` struct, field for field. `shared_layout_tests` holds every one equal to the
//! header. Values go to the kernel as bytes written at the fields' offsets
//! ([`Encode::to_bytes`]), so no padding byte is ever read.

use std::mem::{offset_of, size_of};

use cheetah_core::lb::{Bundle, Counter};
use cheetah_core::types::Mac;
use cheetah_core::verdict::DropReason;

/// `CHEETAH_PIN_LAYOUT`: the layout of the pinned maps' contents (`dataplane/pin.rs`).
pub const PIN_LAYOUT: u32 = 4;
/// `PUBLISH_COPIES`: the copies of every published table (`publish_window.rs`).
pub const PUBLISH_COPIES: usize = 2;
pub const SERVER_ID_SPACE: usize = 16384;
/// `SERVER_SIDE_SLOTS`: entries of `server_side`, indexed by ifindex modulo this.
pub const SERVER_SIDE_SLOTS: usize = 1024;
pub const COOKIE_SPACE: usize = 65536;
pub const MAX_VIPS: usize = 4096;
/// Servers of a pool `vip_info` holds itself; a bigger one is in the VIP's
/// `vip_big_pools` entry ([`VipBigPool`]), which holds any pool (its members are
/// distinct ids).
pub const MAX_HASH_POOL: usize = 64;
pub const MAX_BIG_POOL: usize = SERVER_ID_SPACE;
/// `vip_slots` (`struct vip_slot`): `VIP_SLOTS` slots, a VIP's by a multiplicative hash.
pub const VIP_SLOT_BITS: u32 = 13;
pub const VIP_SLOTS: usize = 1 << VIP_SLOT_BITS;
pub const VIP_SLOT_MULTIPLIER: u32 = 0x9e37_79b1;
pub const VIP_SLOT_USED: u64 = 1 << 48;
/// `reply_senders` (`struct reply_slot`): `REPLY_SLOTS` slots, a sender's by a
/// multiplicative hash of its key.
pub const REPLY_SLOT_BITS: u32 = 16;
pub const REPLY_SLOTS: usize = 1 << REPLY_SLOT_BITS;
pub const REPLY_SLOT_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

pub const LB_FAST_PATH: u32 = 1 << 0;
/// `vips` holds every VIP of the snapshot (at most [`MAX_VIPS`]).
pub const LB_EVERY_VIP: u32 = 1 << 1;
pub const LB_MODE_CHEETAH: u8 = 0;
pub const LB_MODE_HASH: u8 = 1;
pub const LB_MODE_MAGLEV: u8 = 2;
pub const LB_FORWARDING_L2: u8 = 0;
pub const LB_FORWARDING_NAT: u8 = 1;

/// `vip_info.policy`: the policy the kernel places a VIP's SYNs by (NONE: userspace;
/// EMPTY: nobody).
pub const KERNEL_POLICY_NONE: u8 = 0;
pub const KERNEL_POLICY_RR: u8 = 1;
pub const KERNEL_POLICY_WRR: u8 = 2;
pub const KERNEL_POLICY_RANDOM: u8 = 3;
pub const KERNEL_POLICY_HASH: u8 = 4;
pub const KERNEL_POLICY_POW2: u8 = 5;
pub const KERNEL_POLICY_LEAST_LOADED: u8 = 6;
pub const KERNEL_POLICY_AWRR: u8 = 7;
pub const KERNEL_POLICY_MAGLEV: u8 = 8;
/// No server in the pool: every new connection is dropped (`no_server_available`).
pub const KERNEL_POLICY_EMPTY: u8 = 9;
/// `vip_info.load_metric`: which load of the view (`struct active_row`, `struct
/// published_row`) pow2 and least loaded
/// compare.
pub const LOAD_METRIC_ACTIVE: u8 = 0;
pub const LOAD_METRIC_REPORTED: u8 = 1;
pub const LOAD_METRIC_PACKETS: u8 = 2;
pub const LOAD_METRIC_BYTES: u8 = 3;

/// The handshake table the kernel shares (`struct handshake_words`): the core's default
/// size, and its retry filter.
pub const HANDSHAKE_SLOTS: usize = 1 << 18;
pub const HANDSHAKE_RETRY_SLOTS: usize = 1 << 12;

pub const SERVER_FORWARDS: u32 = 1 << 0;
pub const SERVER_EGRESS: u32 = 1 << 1;
/// `server_info.flags`: a removed server's entry (SlotState::Removed), which tells its
/// cookies (`cookie_server_removed`) from those of an id never allocated.
pub const SERVER_REMOVED: u32 = 1 << 2;

/// Indices of the per-CPU `stats` array after the steering counters (`enum xdp_stat`):
/// packets the kernel handled, one per core bundle (`cheetah_core::lb::Bundle`).
pub const STAT_FAST_CLIENT_COOKIE: u32 = 4;
pub const STAT_FAST_CLIENT_PICK: u32 = 5;
pub const STAT_FAST_SERVER_COOKIE: u32 = 6;
pub const STAT_FAST_SERVER_PLAIN: u32 = 7;
/// Each `STAT_FAST_*` counter and the core bundle its packets stand for: metrics add it to
/// every counter of the bundle (`Bundle::counters`), under the core's names.
pub const FAST_BUNDLES: [(u32, Bundle); 7] = [
    (STAT_FAST_CLIENT_COOKIE, Bundle::ClientCookie),
    (STAT_FAST_CLIENT_PICK, Bundle::ClientPick),
    (STAT_FAST_SERVER_COOKIE, Bundle::ServerCookie),
    (STAT_FAST_SERVER_PLAIN, Bundle::ServerPlain),
    (STAT_FAST_CLIENT_SYN, Bundle::ClientSyn),
    (
        STAT_FAST_CLIENT_SYN_RETRANSMITTED,
        Bundle::ClientSynRetransmitted,
    ),
    (STAT_FAST_CLIENT_FALLBACK, Bundle::ClientFallback),
];

/// Why the kernel handed a packet it looked at to userspace, one reason per packet.
pub const STAT_UP_NEW_CONNECTION: u32 = 8;
pub const STAT_UP_LAYOUT: u32 = 9;
pub const STAT_UP_COOKIE: u32 = 10;
pub const STAT_UP_CLOCK: u32 = 11;
pub const STAT_UP_HANDSHAKE_OR_CLOSE: u32 = 12;
pub const STAT_UP_NEXT_HOP: u32 = 13;
pub const STAT_UP_OTHER: u32 = 14;
/// Replies whose next hop was not in `next_hops`: the kernel asked `bpf_fib_lookup`.
pub const STAT_NEXT_HOP_MISS: u32 = 15;
/// A packet that raced a publication (`lb_config.publish_seq` moved): handed up whole.
pub const STAT_UP_PUBLISHING: u32 = 16;
/// Client SYNs the kernel placed by the VIP's policy (retransmitted ones apart).
pub const STAT_FAST_CLIENT_SYN: u32 = 17;
pub const STAT_FAST_CLIENT_SYN_RETRANSMITTED: u32 = 18;
/// A server's FIN or stamped RST handled in the kernel: the first of its connection, or
/// one already counted (lb/closes.rs).
pub const STAT_FAST_SERVER_CLOSE: u32 = 19;
pub const STAT_FAST_SERVER_DUPLICATE_CLOSE: u32 = 20;
/// An ICMP error routed in the kernel by its quoted cookie.
pub const STAT_FAST_ICMP_COOKIE: u32 = 21;
/// An ICMP error routed in the kernel by hash mode's pick.
pub const STAT_FAST_ICMP_PICK: u32 = 22;
/// An ICMP error whose quote has no cookie where the kernel looks: userspace routes it by
/// the fallback table or copies it to every server.
pub const STAT_UP_ICMP: u32 = 23;

/// The `STAT_FAST_*` counters that are no single bundle, each with every core counter one
/// of its packets stands for (what the core counts for that packet): metrics add it to
/// each, under the core's names.
pub const FAST_EVENTS: [(u32, &[Counter]); 70] = [
    // Bundle::ServerCookie, plus the close `on_server_close` counts.
    (
        STAT_FAST_SERVER_CLOSE,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerCloses,
        ],
    ),
    (
        STAT_FAST_SERVER_DUPLICATE_CLOSE,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::DuplicateCloses,
        ],
    ),
    // `client_icmp`'s count, and its verdict's.
    (
        STAT_FAST_ICMP_COOKIE,
        &[Counter::IcmpRoutedByCookie, Counter::ToServer],
    ),
    // The baselines count only the verdict.
    (STAT_FAST_ICMP_PICK, &[Counter::ToServer]),
    // A reply that learnt its server's clock: the entries above, plus what
    // `learn_server_clock` counts.
    (
        STAT_FAST_SERVER_COOKIE_LEARNED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::MsbLearned,
        ],
    ),
    (
        STAT_FAST_SERVER_COOKIE_ADVANCED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::MsbAdvanced,
        ],
    ),
    (
        STAT_FAST_SERVER_CLOSE_LEARNED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerCloses,
            Counter::MsbLearned,
        ],
    ),
    (
        STAT_FAST_SERVER_CLOSE_ADVANCED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerCloses,
            Counter::MsbAdvanced,
        ],
    ),
    (
        STAT_FAST_SERVER_DUPLICATE_CLOSE_LEARNED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::DuplicateCloses,
            Counter::MsbLearned,
        ],
    ),
    (
        STAT_FAST_SERVER_DUPLICATE_CLOSE_ADVANCED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::DuplicateCloses,
            Counter::MsbAdvanced,
        ],
    ),
    // A SYN without options: the option walk, `remember`, its eviction, the handshake
    // table's retransmission, the verdict.
    (
        STAT_FAST_FALLBACK_SYN,
        &[
            Counter::OptionsSlowPath,
            Counter::FallbackConnections,
            Counter::ToServer,
        ],
    ),
    (
        STAT_FAST_FALLBACK_SYN_EVICTED,
        &[
            Counter::OptionsSlowPath,
            Counter::FallbackConnections,
            Counter::FallbackEvictions,
            Counter::ToServer,
        ],
    ),
    (
        STAT_FAST_FALLBACK_SYN_RETRANSMITTED,
        &[
            Counter::OptionsSlowPath,
            Counter::FallbackConnections,
            Counter::SynRetransmissions,
            Counter::ToServer,
        ],
    ),
    (
        STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED,
        &[
            Counter::OptionsSlowPath,
            Counter::FallbackConnections,
            Counter::FallbackEvictions,
            Counter::SynRetransmissions,
            Counter::ToServer,
        ],
    ),
    (
        STAT_FAST_FALLBACK_MISS,
        &[
            Counter::OptionsSlowPath,
            Counter::FallbackMisses,
            Counter::ToServer,
        ],
    ),
    // A server's SYN-ACK without a timestamp: the server path's count, the option walk,
    // what it taught the table (and evicted), the verdict.
    (
        STAT_FAST_SERVER_FALLBACK_LEARNED,
        &[
            Counter::FastPath,
            Counter::OptionsSlowPath,
            Counter::FallbackLearnedFromServer,
            Counter::ToClient,
        ],
    ),
    (
        STAT_FAST_SERVER_FALLBACK_LEARNED_EVICTED,
        &[
            Counter::FastPath,
            Counter::OptionsSlowPath,
            Counter::FallbackLearnedFromServer,
            Counter::FallbackEvictions,
            Counter::ToClient,
        ],
    ),
    // Retired (older programs'): a SYN-ACK that moved its retried SYN's count,
    // Bundle::ServerCookie plus the move.
    (
        STAT_FAST_SERVER_COOKIE_MOVED_RETIRED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::HandshakeCountMoved,
        ],
    ),
    // A client's established segment whose timestamp the options' walk found: the
    // general client path's counts (no `fast_path`; the walk's `options_slow_path`).
    (
        STAT_FAST_CLIENT_COOKIE_WALKED,
        &[
            Counter::OptionsSlowPath,
            Counter::CookieRouted,
            Counter::ToServer,
        ],
    ),
    // A baseline's client segment too short for the straight line: the general path's
    // pick counts only its verdict.
    (STAT_FAST_CLIENT_PICK_GENERAL, &[Counter::ToServer]),
    // A server's segment without a timestamp: `reply_general`'s count (the straight line's
    // header only), the option walk, an RST's `resets_without_timestamp`, the verdict.
    (
        STAT_FAST_SERVER_NO_TIMESTAMP,
        &[
            Counter::FastPath,
            Counter::OptionsSlowPath,
            Counter::ToClient,
        ],
    ),
    (
        STAT_FAST_SERVER_RESET_NO_TIMESTAMP,
        &[
            Counter::FastPath,
            Counter::OptionsSlowPath,
            Counter::ResetsWithoutTimestamp,
            Counter::ToClient,
        ],
    ),
    (
        STAT_FAST_SERVER_NO_TIMESTAMP_GENERAL,
        &[Counter::OptionsSlowPath, Counter::ToClient],
    ),
    (
        STAT_FAST_SERVER_RESET_NO_TIMESTAMP_GENERAL,
        &[
            Counter::OptionsSlowPath,
            Counter::ResetsWithoutTimestamp,
            Counter::ToClient,
        ],
    ),
    // A baseline's reply on the general path counts only its verdict.
    (STAT_FAST_SERVER_PLAIN_GENERAL, &[Counter::ToClient]),
    // A segment whose options the core drops, dropped in the kernel: the verdict's count
    // (its reason is in KERNEL_DROPS).
    (STAT_DROP_TCP_OPTION_TRUNCATED, &[Counter::Dropped]),
    (STAT_DROP_TCP_OPTION_BAD_LENGTH, &[Counter::Dropped]),
    (STAT_DROP_TCP_OPTION_OVERRUN, &[Counter::Dropped]),
    (STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH, &[Counter::Dropped]),
    // A server's reply: its server path's count first.
    (
        STAT_DROP_SERVER_TCP_OPTION_TRUNCATED,
        &[Counter::FastPath, Counter::Dropped],
    ),
    (
        STAT_DROP_SERVER_TCP_OPTION_BAD_LENGTH,
        &[Counter::FastPath, Counter::Dropped],
    ),
    (
        STAT_DROP_SERVER_TCP_OPTION_OVERRUN,
        &[Counter::FastPath, Counter::Dropped],
    ),
    (
        STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH,
        &[Counter::FastPath, Counter::Dropped],
    ),
    (STAT_DROP_UNSUPPORTED_FRAGMENT, &[Counter::Dropped]),
    (STAT_DROP_UNSUPPORTED_UDP, &[Counter::Dropped]),
    (STAT_DROP_UNSUPPORTED_PROTOCOL, &[Counter::Dropped]),
    (STAT_DROP_VIP_PORT_UNKNOWN, &[Counter::Dropped]),
    // The straight line found the sender and counted it before the general path dropped it.
    (
        STAT_DROP_SERVER_REMOVED,
        &[Counter::FastPath, Counter::Dropped],
    ),
    (STAT_DROP_UNKNOWN_SERVER_SOURCE, &[Counter::Dropped]),
    (STAT_DROP_SERVER_REMOVED_GENERAL, &[Counter::Dropped]),
    (STAT_DROP_REPLY_FROM_CLIENT_SIDE, &[Counter::Dropped]),
    // A server's FIN without a timestamp: STAT_FAST_SERVER_NO_TIMESTAMP's counters, plus
    // the close `on_server_close` counts.
    (
        STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE,
        &[
            Counter::FastPath,
            Counter::OptionsSlowPath,
            Counter::ToClient,
            Counter::ServerCloses,
        ],
    ),
    (
        STAT_FAST_SERVER_NO_TIMESTAMP_DUPLICATE_CLOSE,
        &[
            Counter::FastPath,
            Counter::OptionsSlowPath,
            Counter::ToClient,
            Counter::DuplicateCloses,
        ],
    ),
    // A cookie that routes nowhere: the cookie stage's counts, then the drop.
    (
        STAT_DROP_COOKIE_UNKNOWN_SERVER,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::Dropped,
        ],
    ),
    (
        STAT_DROP_COOKIE_SERVER_REMOVED,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::Dropped,
        ],
    ),
    (
        STAT_DROP_TS_MSB_UNKNOWN,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::Dropped,
        ],
    ),
    // An ICMP error's quoted cookie that routes nowhere: the ICMP path counts only the drop.
    (STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER, &[Counter::Dropped]),
    (STAT_DROP_ICMP_COOKIE_SERVER_REMOVED, &[Counter::Dropped]),
    // A garbled IP or TCP header: the core's parse refuses it before counting anything.
    (STAT_DROP_BAD_IP_VERSION, &[Counter::Dropped]),
    (STAT_DROP_BAD_IPV4_HEADER_LENGTH, &[Counter::Dropped]),
    (STAT_DROP_BAD_IPV4_TOTAL_LENGTH, &[Counter::Dropped]),
    (STAT_DROP_TRUNCATED_TCP, &[Counter::Dropped]),
    (STAT_DROP_BAD_TCP_DATA_OFFSET, &[Counter::Dropped]),
    // An ICMP message to a VIP address the core's ICMP path refuses: only the drop.
    (STAT_DROP_TRUNCATED_ICMP, &[Counter::Dropped]),
    (STAT_DROP_UNSUPPORTED_ICMP_TYPE, &[Counter::Dropped]),
    // l2: a packet from a VIP address that is no TCP segment, forwarded as it came.
    (STAT_FAST_SERVER_NOT_TCP, &[Counter::ToClient]),
    // A fallback entry naming a removed server: the option walk's count, then the drop.
    (
        STAT_DROP_FALLBACK_SERVER_REMOVED,
        &[Counter::OptionsSlowPath, Counter::Dropped],
    ),
    // A reply whose clock the core would not learn, forwarded in the kernel: the entry
    // of the same reply without it, plus the core's count of the anomaly.
    (
        STAT_FAST_SERVER_COOKIE_UNSTABLE,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerTsClockUnstable,
        ],
    ),
    (
        STAT_FAST_SERVER_COOKIE_AHEAD,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerTsAheadOfRealTime,
        ],
    ),
    (
        STAT_FAST_SERVER_CLOSE_UNSTABLE,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerCloses,
            Counter::ServerTsClockUnstable,
        ],
    ),
    (
        STAT_FAST_SERVER_CLOSE_AHEAD,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::ServerCloses,
            Counter::ServerTsAheadOfRealTime,
        ],
    ),
    (
        STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::DuplicateCloses,
            Counter::ServerTsClockUnstable,
        ],
    ),
    (
        STAT_FAST_SERVER_DUPLICATE_CLOSE_AHEAD,
        &[
            Counter::FastPath,
            Counter::OptionsFastPath,
            Counter::CookiesInserted,
            Counter::ToClient,
            Counter::DuplicateCloses,
            Counter::ServerTsAheadOfRealTime,
        ],
    ),
    // An ICMP error without a cookie routed by the fallback table: `client_icmp`'s count,
    // and its verdict's.
    (
        STAT_FAST_ICMP_FALLBACK,
        &[Counter::IcmpRoutedByFallback, Counter::ToServer],
    ),
    // Beside a SYN-ACK's own entry: it moved its retried SYN's count.
    (STAT_ANSWER_MOVED, &[Counter::HandshakeCountMoved]),
    // A new connection to an empty pool: the counts its path made, then the drop.
    (
        STAT_DROP_NO_SERVER_AVAILABLE_SYN,
        &[Counter::OptionsFastPath, Counter::Dropped],
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN,
        &[Counter::OptionsSlowPath, Counter::Dropped],
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS,
        &[
            Counter::OptionsSlowPath,
            Counter::FallbackMisses,
            Counter::Dropped,
        ],
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_PICK,
        &[Counter::FastPath, Counter::Dropped],
    ),
    (STAT_DROP_NO_SERVER_AVAILABLE, &[Counter::Dropped]),
];

/// `CLOSE_SLOTS`: the words of `closes`, the core's `closes::DEFAULT_SLOTS`.
pub const CLOSE_SLOTS: usize = 65536;
/// A client segment without TCP options routed by the shared fallback table.
pub const STAT_FAST_CLIENT_FALLBACK: u32 = 24;
/// A client segment without TCP options the fallback table does not know (the core's
/// Maglev decides).
pub const STAT_UP_FALLBACK_MISS: u32 = 25;
/// A reply whose MSB moved, learnt in the kernel (bpf/lib/clock_learn.h): the entry of the
/// same reply without the move, plus `ts_msb_learned` (the server's first MSB) or
/// `ts_msb_advanced`.
pub const STAT_FAST_SERVER_COOKIE_LEARNED: u32 = 26;
pub const STAT_FAST_SERVER_COOKIE_ADVANCED: u32 = 27;
pub const STAT_FAST_SERVER_CLOSE_LEARNED: u32 = 28;
pub const STAT_FAST_SERVER_CLOSE_ADVANCED: u32 = 29;
pub const STAT_FAST_SERVER_DUPLICATE_CLOSE_LEARNED: u32 = 30;
pub const STAT_FAST_SERVER_DUPLICATE_CLOSE_ADVANCED: u32 = 31;
/// Server replies `reply_senders` did not know, found by steering's lookups instead.
pub const STAT_REPLY_BY_STEERING: u32 = 32;
/// A client SYN without TCP options placed by the VIP's Maglev table and remembered in the
/// fallback table; with an eviction, a retransmission, or both.
pub const STAT_FAST_FALLBACK_SYN: u32 = 33;
pub const STAT_FAST_FALLBACK_SYN_EVICTED: u32 = 34;
pub const STAT_FAST_FALLBACK_SYN_RETRANSMITTED: u32 = 35;
pub const STAT_FAST_FALLBACK_SYN_EVICTED_RETRANSMITTED: u32 = 36;
/// A client segment without TCP options the fallback table does not know, forwarded by
/// the VIP's Maglev table.
pub const STAT_FAST_FALLBACK_MISS: u32 = 37;
/// A server's SYN-ACK without a timestamp that taught the fallback table its server
/// (evicting a flow, or not).
pub const STAT_FAST_SERVER_FALLBACK_LEARNED: u32 = 38;
pub const STAT_FAST_SERVER_FALLBACK_LEARNED_EVICTED: u32 = 39;
/// Retired: what programs before [`STAT_ANSWER_MOVED`] counted for a SYN-ACK with a
/// timestamp that moved its retried SYN's load count. Never counted now; kept in
/// [`FAST_EVENTS`] so that the counts a pinned `stats` map holds from an older program
/// keep their meaning after an upgrade.
pub const STAT_FAST_SERVER_COOKIE_MOVED_RETIRED: u32 = 40;
/// Replies whose next hop this CPU's `next_hop_cache` did not hold for the current
/// publication: the kernel read `next_hops` (and maybe the FIB) instead.
pub const STAT_NEXT_HOP_CACHE_MISS: u32 = 41;

/// A client's established segment whose timestamp the options' walk found (not NOP NOP
/// TS first), or a client's SYN-ACK, routed by its cookie in the kernel (the core's
/// general path).
pub const STAT_FAST_CLIENT_COOKIE_WALKED: u32 = 42;
/// Counted beside the `STAT_FAST_*` entry of a packet whose timestamp the options' walk
/// found where that entry stands for `options_fast_path`: the core counted
/// `options_slow_path` in its place ([`OPTIONS_WALKED`]).
pub const STAT_OPTIONS_WALKED: u32 = 43;
/// What one [`STAT_OPTIONS_WALKED`] packet moves: one count from the first counter (which
/// its `STAT_FAST_*` entry stands for) to the second.
pub const OPTIONS_WALKED: (Counter, Counter) = (Counter::OptionsFastPath, Counter::OptionsSlowPath);

/// A baseline's client segment whose TCP header is too short for the straight line (20,
/// 24 or 28 bytes), forwarded in the kernel by its pick.
pub const STAT_FAST_CLIENT_PICK_GENERAL: u32 = 44;

/// A server's segment in cheetah mode (neither SYN nor FIN) without a timestamp option,
/// forwarded in the kernel without a cookie; with RST (never a close), or not.
pub const STAT_FAST_SERVER_NO_TIMESTAMP: u32 = 45;
pub const STAT_FAST_SERVER_RESET_NO_TIMESTAMP: u32 = 46;
/// The same with a TCP header too short for the straight line (the core's general path).
pub const STAT_FAST_SERVER_NO_TIMESTAMP_GENERAL: u32 = 47;
pub const STAT_FAST_SERVER_RESET_NO_TIMESTAMP_GENERAL: u32 = 48;
/// A baseline's server segment whose TCP header is too short for the straight line.
pub const STAT_FAST_SERVER_PLAIN_GENERAL: u32 = 49;

/// A segment to a VIP whose TCP options the core drops, or a server's reply too short for
/// the straight line whose options it drops (its general path counts nothing first),
/// dropped in the kernel: one entry per reason, in the order of the options' walk's codes
/// (parse.h).
pub const STAT_DROP_TCP_OPTION_TRUNCATED: u32 = 50;
pub const STAT_DROP_TCP_OPTION_BAD_LENGTH: u32 = 51;
pub const STAT_DROP_TCP_OPTION_OVERRUN: u32 = 52;
pub const STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH: u32 = 53;
/// The same for a server's reply (the core counted `fast_path` first).
pub const STAT_DROP_SERVER_TCP_OPTION_TRUNCATED: u32 = 54;
pub const STAT_DROP_SERVER_TCP_OPTION_BAD_LENGTH: u32 = 55;
pub const STAT_DROP_SERVER_TCP_OPTION_OVERRUN: u32 = 56;
pub const STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH: u32 = 57;
/// An IPv4 fragment to a VIP address, dropped in the kernel.
pub const STAT_DROP_UNSUPPORTED_FRAGMENT: u32 = 58;
/// Traffic to a VIP address that no VIP takes, dropped in the kernel (not_a_vip.h).
pub const STAT_DROP_UNSUPPORTED_UDP: u32 = 59;
pub const STAT_DROP_UNSUPPORTED_PROTOCOL: u32 = 60;
pub const STAT_DROP_VIP_PORT_UNKNOWN: u32 = 61;
/// l2: a segment from a VIP address of a server that no longer forwards, or from a MAC no
/// server has (reply_sender.h).
pub const STAT_DROP_SERVER_REMOVED: u32 = 62;
pub const STAT_DROP_UNKNOWN_SERVER_SOURCE: u32 = 63;
/// A removed server's segment too short for the straight line, and (nat) any late reply
/// of a removed server: the core's general path (no `fast_path`).
pub const STAT_DROP_SERVER_REMOVED_GENERAL: u32 = 64;
/// A server's FIN without a timestamp option in cheetah mode, its close counted as a
/// stamped one's: the first of its connection, or one already counted.
pub const STAT_FAST_SERVER_NO_TIMESTAMP_CLOSE: u32 = 65;
pub const STAT_FAST_SERVER_NO_TIMESTAMP_DUPLICATE_CLOSE: u32 = 66;
/// Counted beside the entry of a segment the core's general path took, which counts no
/// `fast_path`, where that entry stands for the straight line's ([`GENERAL_PATH`]): a
/// server segment whose TCP header is too short for the straight line, a client segment
/// whose walked timestamp's cookie routes nowhere.
pub const STAT_GENERAL_PATH: u32 = 67;
/// The counter one [`STAT_GENERAL_PATH`] packet takes a count off.
pub const GENERAL_PATH: Counter = Counter::FastPath;
/// A server's reply that arrived on an interface facing the clients, dropped in the kernel
/// (reply_sender.h).
pub const STAT_DROP_REPLY_FROM_CLIENT_SIDE: u32 = 68;
/// A client segment whose cookie routes nowhere (fast_path.h route_by_cookie), dropped in
/// the kernel: it names an id no server has, a removed server, or an unknown clock.
pub const STAT_DROP_COOKIE_UNKNOWN_SERVER: u32 = 69;
pub const STAT_DROP_COOKIE_SERVER_REMOVED: u32 = 70;
pub const STAT_DROP_TS_MSB_UNKNOWN: u32 = 71;
/// An ICMP error whose quoted cookie names an id no server has, or a removed server,
/// dropped in the kernel (icmp_path.h).
pub const STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER: u32 = 72;
pub const STAT_DROP_ICMP_COOKIE_SERVER_REMOVED: u32 = 73;
/// The core's reason for each `STAT_DROP_*` entry: metrics count the kernel's drops under
/// the core's names (`cheetah_drops`, worker `xdp`).
pub const KERNEL_DROPS: [(u32, DropReason); 34] = [
    (
        STAT_DROP_TCP_OPTION_TRUNCATED,
        DropReason::TcpOptionTruncated,
    ),
    (
        STAT_DROP_TCP_OPTION_BAD_LENGTH,
        DropReason::TcpOptionBadLength,
    ),
    (STAT_DROP_TCP_OPTION_OVERRUN, DropReason::TcpOptionOverrun),
    (
        STAT_DROP_BAD_TIMESTAMP_OPTION_LENGTH,
        DropReason::BadTimestampOptionLength,
    ),
    (
        STAT_DROP_SERVER_TCP_OPTION_TRUNCATED,
        DropReason::TcpOptionTruncated,
    ),
    (
        STAT_DROP_SERVER_TCP_OPTION_BAD_LENGTH,
        DropReason::TcpOptionBadLength,
    ),
    (
        STAT_DROP_SERVER_TCP_OPTION_OVERRUN,
        DropReason::TcpOptionOverrun,
    ),
    (
        STAT_DROP_SERVER_BAD_TIMESTAMP_OPTION_LENGTH,
        DropReason::BadTimestampOptionLength,
    ),
    (
        STAT_DROP_UNSUPPORTED_FRAGMENT,
        DropReason::UnsupportedFragment,
    ),
    (STAT_DROP_UNSUPPORTED_UDP, DropReason::UnsupportedUdp),
    (
        STAT_DROP_UNSUPPORTED_PROTOCOL,
        DropReason::UnsupportedProtocol,
    ),
    (STAT_DROP_VIP_PORT_UNKNOWN, DropReason::VipPortUnknown),
    (STAT_DROP_SERVER_REMOVED, DropReason::ServerRemoved),
    (
        STAT_DROP_UNKNOWN_SERVER_SOURCE,
        DropReason::UnknownServerSource,
    ),
    (STAT_DROP_SERVER_REMOVED_GENERAL, DropReason::ServerRemoved),
    (
        STAT_DROP_REPLY_FROM_CLIENT_SIDE,
        DropReason::ReplyFromClientSide,
    ),
    (
        STAT_DROP_COOKIE_UNKNOWN_SERVER,
        DropReason::CookieUnknownServer,
    ),
    (
        STAT_DROP_COOKIE_SERVER_REMOVED,
        DropReason::CookieServerRemoved,
    ),
    (STAT_DROP_TS_MSB_UNKNOWN, DropReason::TsMsbUnknown),
    (
        STAT_DROP_ICMP_COOKIE_UNKNOWN_SERVER,
        DropReason::CookieUnknownServer,
    ),
    (
        STAT_DROP_ICMP_COOKIE_SERVER_REMOVED,
        DropReason::CookieServerRemoved,
    ),
    (STAT_DROP_BAD_IP_VERSION, DropReason::BadIpVersion),
    (
        STAT_DROP_BAD_IPV4_HEADER_LENGTH,
        DropReason::BadIpv4HeaderLength,
    ),
    (
        STAT_DROP_BAD_IPV4_TOTAL_LENGTH,
        DropReason::BadIpv4TotalLength,
    ),
    (STAT_DROP_TRUNCATED_TCP, DropReason::TruncatedTcp),
    (STAT_DROP_BAD_TCP_DATA_OFFSET, DropReason::BadTcpDataOffset),
    (
        STAT_DROP_FALLBACK_SERVER_REMOVED,
        DropReason::FallbackServerRemoved,
    ),
    (STAT_DROP_TRUNCATED_ICMP, DropReason::TruncatedIcmp),
    (
        STAT_DROP_UNSUPPORTED_ICMP_TYPE,
        DropReason::UnsupportedIcmpType,
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_SYN,
        DropReason::NoServerAvailable,
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN,
        DropReason::NoServerAvailable,
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS,
        DropReason::NoServerAvailable,
    ),
    (
        STAT_DROP_NO_SERVER_AVAILABLE_PICK,
        DropReason::NoServerAvailable,
    ),
    (STAT_DROP_NO_SERVER_AVAILABLE, DropReason::NoServerAvailable),
];

/// An echo (a client's TSecr, an ICMP error's quoted TSval) the kernel restored and
/// forwarded more than 2^(k-1) periods behind its server's newest MSB, counted beside the
/// packet's entry: the core's `echoes_beyond_idle_limit`.
pub const STAT_ECHO_BEYOND_IDLE_LIMIT: u32 = 74;
/// A packet steering gave the LB with an IPv4 header the core refuses, and a TCP segment to
/// a VIP address with a TCP header it refuses, dropped in the kernel (parse.h's faults).
pub const STAT_DROP_BAD_IP_VERSION: u32 = 75;
pub const STAT_DROP_BAD_IPV4_HEADER_LENGTH: u32 = 76;
pub const STAT_DROP_BAD_IPV4_TOTAL_LENGTH: u32 = 77;
pub const STAT_DROP_TRUNCATED_TCP: u32 = 78;
pub const STAT_DROP_BAD_TCP_DATA_OFFSET: u32 = 79;
/// A client segment without a timestamp whose fallback entry names a server that no longer
/// forwards, dropped (its entry removed) in the kernel (fallback.h).
pub const STAT_DROP_FALLBACK_SERVER_REMOVED: u32 = 80;
/// A reply whose clock the core would not learn, forwarded in the kernel (one a second per
/// CPU goes up instead, for the workers' warning): the entry of the same reply without it
/// (a cookie, a first close, a duplicate close), plus `server_ts_clock_unstable` or
/// `server_ts_ahead_of_real_time`.
pub const STAT_FAST_SERVER_COOKIE_UNSTABLE: u32 = 81;
pub const STAT_FAST_SERVER_COOKIE_AHEAD: u32 = 82;
pub const STAT_FAST_SERVER_CLOSE_UNSTABLE: u32 = 83;
pub const STAT_FAST_SERVER_CLOSE_AHEAD: u32 = 84;
pub const STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE: u32 = 85;
pub const STAT_FAST_SERVER_DUPLICATE_CLOSE_AHEAD: u32 = 86;
/// An ICMP message to a VIP address the core's ICMP path refuses before it looks for a VIP
/// (too short, not an error, quoting no TCP segment from that address), dropped in the
/// kernel (icmp_path.h).
pub const STAT_DROP_TRUNCATED_ICMP: u32 = 87;
pub const STAT_DROP_UNSUPPORTED_ICMP_TYPE: u32 = 88;
/// l2: a packet from a VIP address that is no TCP segment, from a server's MAC, forwarded
/// to the client as it came (reply_sender.h).
pub const STAT_FAST_SERVER_NOT_TCP: u32 = 89;
/// Cheetah mode: an ICMP error whose quote carries no cookie, routed to the server the
/// fallback table remembers for the quoted connection (icmp_path.h).
pub const STAT_FAST_ICMP_FALLBACK: u32 = 90;
/// Counted beside a SYN-ACK's own `STAT_FAST_*` entry (a cookie written, a clock learnt,
/// the fallback table taught) when it answered a retried SYN first and moved the
/// connection's load count to its server: the core's `handshake_count_moved`.
pub const STAT_ANSWER_MOVED: u32 = 91;
/// Counted beside an entry that stands for `options_slow_path` where the core counted
/// `options_fast_path`: a client segment without SYN and ACK whose options start NOP NOP
/// TS (a fallback entry), a client's SYN-ACK with a Table 1 layout (a cookie entry)
/// ([`OPTIONS_WALKED`] the other way round).
pub const STAT_OPTIONS_COMPARED: u32 = 92;
/// A new connection to a VIP whose pool is empty (`KERNEL_POLICY_EMPTY`), dropped in the
/// kernel after its path's counts: a SYN with a timestamp (`STAT_OPTIONS_WALKED` beside
/// it when walked), one without, a fallback miss, a baseline's pick on the straight line
/// and on the general path.
pub const STAT_DROP_NO_SERVER_AVAILABLE_SYN: u32 = 93;
pub const STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_SYN: u32 = 94;
pub const STAT_DROP_NO_SERVER_AVAILABLE_FALLBACK_MISS: u32 = 95;
pub const STAT_DROP_NO_SERVER_AVAILABLE_PICK: u32 = 96;
pub const STAT_DROP_NO_SERVER_AVAILABLE: u32 = 97;
pub const STAT_COUNT: u32 = 98;
/// The entries of an ICMP error forwarded to a server: by its quoted cookie, a baseline's
/// pick, the fallback table. None counts toward the server's load, as in the core.
pub const ICMP_FORWARDS: [u32; 3] = [
    STAT_FAST_ICMP_COOKIE,
    STAT_FAST_ICMP_PICK,
    STAT_FAST_ICMP_FALLBACK,
];
/// Entries of the `stats` map (`STAT_SLOTS`): more than [`STAT_COUNT`], with room for
/// counters an upgrade appends.
pub const STAT_SLOTS: u32 = 128;
/// Slots of a Maglev table per entry of its inner array (`struct maglev_chunk`).
pub const MAGLEV_CHUNK_SLOTS: usize = 32;
/// A slot past a table's end in its last chunk.
pub const MAGLEV_NO_SERVER: u16 = u16::MAX;

/// `struct maglev_chunk`: one entry of a VIP's inner array in `maglev_tables`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevChunk {
    pub server: [u16; MAGLEV_CHUNK_SLOTS],
}

/// Ways of a fallback table set (`FALLBACK_WAYS`): the core's `fallback::WAYS`.
pub const FALLBACK_WAYS: usize = 8;

/// `struct fallback_set`: one entry of the `fallback` map, one set of the core's table
/// (read through the map's mmap, never as a value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallbackSet {
    pub way: [u64; FALLBACK_WAYS],
}

pub const MAX_NEXT_HOPS: usize = 16384;
pub const NEXT_HOP_FIB: u32 = 0;
pub const NEXT_HOP_KNOWN: u32 = 1;
pub const NEXT_HOP_ON_LINK: u32 = 2;

/// The `reason` label of each `STAT_UP_*` counter, in index order.
pub const UP_REASONS: [(u32, &str); 10] = [
    (STAT_UP_NEW_CONNECTION, "new_connection"),
    (STAT_UP_LAYOUT, "layout"),
    (STAT_UP_COOKIE, "cookie"),
    (STAT_UP_CLOCK, "clock"),
    (STAT_UP_HANDSHAKE_OR_CLOSE, "handshake_or_close"),
    (STAT_UP_NEXT_HOP, "next_hop"),
    (STAT_UP_OTHER, "other"),
    (STAT_UP_PUBLISHING, "publishing"),
    (STAT_UP_ICMP, "icmp"),
    (STAT_UP_FALLBACK_MISS, "fallback_miss"),
];

/// A value the kernel reads as bytes.
pub trait Encode: Sized {
    /// The struct's bytes as C lays them out (padding zero).
    fn to_bytes(&self) -> Vec<u8>;
}

/// Bytes of a `T`, filled field by field at the offsets Rust (and, by the layout test, C)
/// gives them.
struct Bytes(Vec<u8>);

impl Bytes {
    fn of<T>() -> Self {
        Bytes(vec![0; size_of::<T>()])
    }

    fn put(mut self, at: usize, field: &[u8]) -> Self {
        self.0[at..at + field.len()].copy_from_slice(field);
        self
    }
}

/// `struct lb_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbConfigValue {
    pub flags: u32,
    pub mode: u8,
    pub forwarding: u8,
    pub id_bits: u8,
    /// Which entry of `lb_config` this is: the copy of the tables it goes with.
    pub copy: u8,
    pub id_mask: u16,
    pub pad2: u16,
    pub generation: u32,
    /// The publisher's latch word (bpf/lib/publish.h), read in entry 0 only: written
    /// through the map's mmap by [`PublishWindow`](super::publish_window::PublishWindow)
    /// only; an update of the whole value must carry the word as it is.
    pub publish_seq: u32,
    /// The fallback table's sets - 1.
    pub fallback_mask: u32,
    /// Slots of every VIP's Maglev table (`maglev_tables`); 0: none published.
    pub maglev_size: u32,
    /// CLOCK_MONOTONIC ns at which the daemon's clock read 0 (`Clock::monotonic_base_ns`):
    /// set by `SteeringProgram::set_clock_base` alone; an update of the whole value must
    /// carry it as it is.
    pub clock_base_ns: u64,
    /// Bit `vip_addr_bit(a)` set for every address `a` of `vip_addrs`.
    pub vip_addr_filter: u64,
}

impl Encode for LbConfigValue {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, flags), &self.flags.to_ne_bytes())
            .put(offset_of!(Self, mode), &[self.mode])
            .put(offset_of!(Self, forwarding), &[self.forwarding])
            .put(offset_of!(Self, id_bits), &[self.id_bits])
            .put(offset_of!(Self, copy), &[self.copy])
            .put(offset_of!(Self, id_mask), &self.id_mask.to_ne_bytes())
            .put(offset_of!(Self, generation), &self.generation.to_ne_bytes())
            .put(
                offset_of!(Self, publish_seq),
                &self.publish_seq.to_ne_bytes(),
            )
            .put(
                offset_of!(Self, fallback_mask),
                &self.fallback_mask.to_ne_bytes(),
            )
            .put(
                offset_of!(Self, maglev_size),
                &self.maglev_size.to_ne_bytes(),
            )
            .put(
                offset_of!(Self, clock_base_ns),
                &self.clock_base_ns.to_ne_bytes(),
            )
            .put(
                offset_of!(Self, vip_addr_filter),
                &self.vip_addr_filter.to_ne_bytes(),
            )
            .0
    }
}

/// `struct vip_key` (address and port in network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipKey {
    pub addr: [u8; 4],
    pub port: [u8; 2],
    pub protocol: u8,
    /// Of the published tables: the publisher sets it per copy (`xdp_tables.rs`).
    pub copy: u8,
}

impl Encode for VipKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, addr), &self.addr)
            .put(offset_of!(Self, port), &self.port)
            .put(offset_of!(Self, protocol), &[self.protocol])
            .put(offset_of!(Self, copy), &[self.copy])
            .0
    }
}

/// `struct vip_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipInfo {
    pub hash_prefix: [u64; 4],
    pub addr: [u8; 4],
    pub port: [u8; 2],
    pub backend_port: [u8; 2],
    pub index: u16,
    pub pool_len: u16,
    pub pool: [u16; MAX_HASH_POOL],
    pub policy: u8,
    pub load_metric: u8,
    pub pad: [u8; 2],
}

impl Encode for VipInfo {
    fn to_bytes(&self) -> Vec<u8> {
        let prefix: Vec<u8> = self
            .hash_prefix
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        let pool: Vec<u8> = self.pool.iter().flat_map(|id| id.to_ne_bytes()).collect();
        Bytes::of::<Self>()
            .put(offset_of!(Self, hash_prefix), &prefix)
            .put(offset_of!(Self, addr), &self.addr)
            .put(offset_of!(Self, port), &self.port)
            .put(offset_of!(Self, backend_port), &self.backend_port)
            .put(offset_of!(Self, index), &self.index.to_ne_bytes())
            .put(offset_of!(Self, pool_len), &self.pool_len.to_ne_bytes())
            .put(offset_of!(Self, pool), &pool)
            .put(offset_of!(Self, policy), &[self.policy])
            .put(offset_of!(Self, load_metric), &[self.load_metric])
            .0
    }
}

/// `struct vip_slot` (`vip_slots.rs` fills it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipSlot {
    pub tag: u64,
    pub hash_prefix: [u64; 4],
    pub port: [u8; 2],
    pub backend_port: [u8; 2],
    pub pad: u32,
    pub pad2: [u64; 2],
}

impl Encode for VipSlot {
    fn to_bytes(&self) -> Vec<u8> {
        let prefix: Vec<u8> = self
            .hash_prefix
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        Bytes::of::<Self>()
            .put(offset_of!(Self, tag), &self.tag.to_ne_bytes())
            .put(offset_of!(Self, hash_prefix), &prefix)
            .put(offset_of!(Self, port), &self.port)
            .put(offset_of!(Self, backend_port), &self.backend_port)
            .0
    }
}

/// `struct server_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerInfo {
    pub flags: u32,
    pub dip: [u8; 4],
    pub egress_ifindex: u32,
    pub dst_mac: Mac,
    pub src_mac: Mac,
}

impl Encode for ServerInfo {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, flags), &self.flags.to_ne_bytes())
            .put(offset_of!(Self, dip), &self.dip)
            .put(
                offset_of!(Self, egress_ifindex),
                &self.egress_ifindex.to_ne_bytes(),
            )
            .put(offset_of!(Self, dst_mac), &self.dst_mac)
            .put(offset_of!(Self, src_mac), &self.src_mac)
            .0
    }
}

/// `struct mac_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MacKey {
    pub mac: Mac,
    /// Of the published tables: the publisher sets it per copy (`xdp_tables.rs`).
    pub copy: u16,
}

impl Encode for MacKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, mac), &self.mac)
            .put(offset_of!(Self, copy), &self.copy.to_ne_bytes())
            .0
    }
}

/// `struct backend_key` (both in network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendKey {
    pub addr: [u8; 4],
    pub port: [u8; 2],
    /// Of the published tables: the publisher sets it per copy (`xdp_tables.rs`).
    pub copy: u16,
}

impl Encode for BackendKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, addr), &self.addr)
            .put(offset_of!(Self, port), &self.port)
            .put(offset_of!(Self, copy), &self.copy.to_ne_bytes())
            .0
    }
}

/// `struct backend_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    pub server: u16,
    pub vip_index: u16,
    pub flags: u32,
}

/// `BACKEND_DIP_OF_REMOVED`: a removed server had the entry's DIP.
pub const BACKEND_DIP_OF_REMOVED: u32 = 1 << 0;

/// `VIP_ADDR_DIP_OF_REMOVED`, in a `vip_addrs` value: a removed server had the address.
pub const VIP_ADDR_DIP_OF_REMOVED: u32 = 1 << 0;

impl Encode for BackendInfo {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, server), &self.server.to_ne_bytes())
            .put(offset_of!(Self, vip_index), &self.vip_index.to_ne_bytes())
            .put(offset_of!(Self, flags), &self.flags.to_ne_bytes())
            .0
    }
}

/// `struct reply_key`: l2 the VIP's address and port and the server's MAC; nat the
/// backend's address and port, `mac` zero (addresses and ports in network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyKey {
    pub addr: [u8; 4],
    pub port: [u8; 2],
    pub mac: Mac,
}

impl Encode for ReplyKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, addr), &self.addr)
            .put(offset_of!(Self, port), &self.port)
            .put(offset_of!(Self, mac), &self.mac)
            .0
    }
}

/// `struct reply_sender`: the server a reply comes from and what the reply path reads of
/// the VIP it answers for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplySender {
    pub hash_prefix: [u64; 4],
    pub vip_addr: [u8; 4],
    pub vip_port: [u8; 2],
    pub server: u16,
}

impl Encode for ReplySender {
    fn to_bytes(&self) -> Vec<u8> {
        let prefix: Vec<u8> = self
            .hash_prefix
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        Bytes::of::<Self>()
            .put(offset_of!(Self, hash_prefix), &prefix)
            .put(offset_of!(Self, vip_addr), &self.vip_addr)
            .put(offset_of!(Self, vip_port), &self.vip_port)
            .put(offset_of!(Self, server), &self.server.to_ne_bytes())
            .0
    }
}

/// `struct reply_slot`: a sender at its slot of `reply_senders` (`used` 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplySlot {
    pub key: ReplyKey,
    pub used: u32,
    pub sender: ReplySender,
    pub pad: u64,
}

impl Encode for ReplySlot {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, key), &self.key.to_bytes())
            .put(offset_of!(Self, used), &self.used.to_ne_bytes())
            .put(offset_of!(Self, sender), &self.sender.to_bytes())
            .0
    }
}

/// `struct next_hop_key`: an IPv4 prefix, as the LPM trie reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NextHopKey {
    /// 32 (the copy's bits) more than the prefix's length.
    pub prefixlen: u32,
    pub copy: u32,
    pub addr: [u8; 4],
}

impl Encode for NextHopKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, prefixlen), &self.prefixlen.to_ne_bytes())
            .put(offset_of!(Self, copy), &self.copy.to_ne_bytes())
            .put(offset_of!(Self, addr), &self.addr)
            .0
    }
}

/// `struct vip_addr_key` (`vip_addrs`) and `struct next_hop_host_key` (`next_hop_hosts`):
/// an address (network byte order) in one copy of the tables.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AddrKey {
    pub addr: [u8; 4],
    pub copy: u32,
}

impl Encode for AddrKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, addr), &self.addr)
            .put(offset_of!(Self, copy), &self.copy.to_ne_bytes())
            .0
    }
}

/// `struct next_hop`: `kind` says whether it is the answer (`NEXT_HOP_KNOWN`), sends the
/// kernel to `next_hop_hosts` (`NEXT_HOP_ON_LINK`) or to `bpf_fib_lookup` (`NEXT_HOP_FIB`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHop {
    pub kind: u32,
    pub ifindex: u32,
    pub mtu: u32,
    pub dmac: Mac,
    pub smac: Mac,
}

impl Encode for NextHop {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, kind), &self.kind.to_ne_bytes())
            .put(offset_of!(Self, ifindex), &self.ifindex.to_ne_bytes())
            .put(offset_of!(Self, mtu), &self.mtu.to_ne_bytes())
            .put(offset_of!(Self, dmac), &self.dmac)
            .put(offset_of!(Self, smac), &self.smac)
            .0
    }
}

/// `struct server_traffic` (one CPU's share).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerTraffic {
    pub packets: u64,
    pub bytes: u64,
    pub opened: u64,
    pub closed: u64,
    pub moved_in: u64,
    pub pad: u64,
}

impl ServerTraffic {
    /// One CPU's value as the kernel returns it.
    pub fn read(bytes: &[u8]) -> Self {
        let word = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
        ServerTraffic {
            packets: word(offset_of!(Self, packets)),
            bytes: word(offset_of!(Self, bytes)),
            opened: word(offset_of!(Self, opened)),
            closed: word(offset_of!(Self, closed)),
            moved_in: word(offset_of!(Self, moved_in)),
            pad: 0,
        }
    }

    /// What these counts add to the server's active connections: each pick and each count
    /// moved in is one up, each released count one down (wrapping, as the counts grow
    /// without bound).
    pub fn active_delta(&self) -> i64 {
        self.opened
            .wrapping_add(self.moved_in)
            .wrapping_sub(self.closed) as i64
    }

    /// Field by field, wrapping: sums over CPUs, and differences since an earlier reading.
    pub fn wrapping_add(self, other: Self) -> Self {
        ServerTraffic {
            packets: self.packets.wrapping_add(other.packets),
            bytes: self.bytes.wrapping_add(other.bytes),
            opened: self.opened.wrapping_add(other.opened),
            closed: self.closed.wrapping_add(other.closed),
            moved_in: self.moved_in.wrapping_add(other.moved_in),
            pad: 0,
        }
    }

    pub fn wrapping_sub(self, other: Self) -> Self {
        ServerTraffic {
            packets: self.packets.wrapping_sub(other.packets),
            bytes: self.bytes.wrapping_sub(other.bytes),
            opened: self.opened.wrapping_sub(other.opened),
            closed: self.closed.wrapping_sub(other.closed),
            moved_in: self.moved_in.wrapping_sub(other.moved_in),
            pad: 0,
        }
    }
}

/// `struct vip_weights`: a wrr VIP's weight per pool position (each at least 1) and their sum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipWeights {
    pub total: i64,
    pub weight: [u32; MAX_HASH_POOL],
}

impl Encode for VipWeights {
    fn to_bytes(&self) -> Vec<u8> {
        let weight: Vec<u8> = self.weight.iter().flat_map(|w| w.to_ne_bytes()).collect();
        Bytes::of::<Self>()
            .put(offset_of!(Self, total), &self.total.to_ne_bytes())
            .put(offset_of!(Self, weight), &weight)
            .0
    }
}

/// `struct vip_big_pool`: the pool of a VIP with more than [`MAX_HASH_POOL`] servers, by
/// position.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipBigPool {
    pub id: [u16; MAX_BIG_POOL],
}

impl VipBigPool {
    /// The value for `pool` (its first [`MAX_BIG_POOL`] ids; the rest of the array 0).
    pub fn value_of(pool: &[u16]) -> Vec<u8> {
        let ids: Vec<u8> = pool
            .iter()
            .take(MAX_BIG_POOL)
            .flat_map(|id| id.to_ne_bytes())
            .collect();
        Bytes::of::<Self>().put(offset_of!(Self, id), &ids).0
    }
}

/// `struct vip_schedule`'s capacity: the core's `SCHEDULE_CAP`.
pub const SCHEDULE_CAP: usize = cheetah_core::policy::schedule::SCHEDULE_CAP;
// Every pool the kernel holds fits a cycle once its weights allow: awrr's always do
// (`awrr_buckets_into`), xdp_tables.rs `kernel_policy`.
const _: () = assert!(MAX_BIG_POOL <= SCHEDULE_CAP);

/// `struct vip_schedule`: one cycle of a wrr or awrr VIP's picks as pool positions.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipSchedule {
    pub len: u32,
    pub position: [u16; SCHEDULE_CAP],
}

impl VipSchedule {
    /// The value for `cycle` (at most [`SCHEDULE_MAX_LEN`] entries): its length and its
    /// first [`SCHEDULE_CAP`] entries; the rest go to [`ScheduleChunk::values_of`].
    pub fn value_of(cycle: &[u16]) -> Vec<u8> {
        let len = cycle.len().min(SCHEDULE_MAX_LEN);
        let head = &cycle[..len.min(SCHEDULE_CAP)];
        let positions: Vec<u8> = head.iter().flat_map(|p| p.to_ne_bytes()).collect();
        Bytes::of::<Self>()
            .put(offset_of!(Self, len), &(len as u32).to_ne_bytes())
            .put(offset_of!(Self, position), &positions)
            .0
    }
}

/// Chunks a wrr cycle may take, its first included (`SCHEDULE_CHUNKS`).
pub const SCHEDULE_CHUNKS: usize = 32;
/// The most entries of a cycle the kernel reads (`SCHEDULE_MAX_LEN`).
pub const SCHEDULE_MAX_LEN: usize = SCHEDULE_CHUNKS * SCHEDULE_CAP;
/// `wrr_schedule_chunks` entries a copy of the tables may take (`SCHEDULE_CHUNK_BUDGET`).
pub const SCHEDULE_CHUNK_BUDGET: usize = 1024;

/// `struct schedule_chunk_key`: chunk `chunk` of VIP `index`'s wrr cycle.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleChunkKey {
    pub index: u16,
    pub chunk: u8,
    /// Of the published tables: the publisher sets it per copy (`xdp_tables.rs`).
    pub copy: u8,
}

impl Encode for ScheduleChunkKey {
    fn to_bytes(&self) -> Vec<u8> {
        Bytes::of::<Self>()
            .put(offset_of!(Self, index), &self.index.to_ne_bytes())
            .put(offset_of!(Self, chunk), &[self.chunk])
            .put(offset_of!(Self, copy), &[self.copy])
            .0
    }
}

/// `struct schedule_chunk`: entries `chunk * SCHEDULE_CAP` on of a cycle.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleChunk {
    pub position: [u16; SCHEDULE_CAP],
}

impl ScheduleChunk {
    /// The chunks of `cycle` beyond its first [`SCHEDULE_CAP`] entries (at most
    /// [`SCHEDULE_MAX_LEN`] entries in all): (chunk, value), from chunk 1 on.
    pub fn values_of(cycle: &[u16]) -> Vec<(u8, Vec<u8>)> {
        let cycle = &cycle[..cycle.len().min(SCHEDULE_MAX_LEN)];
        cycle
            .chunks(SCHEDULE_CAP)
            .enumerate()
            .skip(1)
            .map(|(chunk, entries)| {
                let positions: Vec<u8> = entries.iter().flat_map(|p| p.to_ne_bytes()).collect();
                let value = Bytes::of::<Self>()
                    .put(offset_of!(Self, position), &positions)
                    .0;
                (chunk as u8, value)
            })
            .collect()
    }
}

/// `struct policy_state`: one CPU's rr cursor, schedule cursor and wrr credits for one
/// VIP (`credit[i] = wrr_base[i] + wrr_steps * weight[i]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyState {
    pub rr_position: u32,
    pub schedule_cursor: u32,
    pub wrr_steps: u64,
    pub wrr_base: [i64; MAX_HASH_POOL],
}

impl Encode for PolicyState {
    fn to_bytes(&self) -> Vec<u8> {
        let base: Vec<u8> = self.wrr_base.iter().flat_map(|c| c.to_ne_bytes()).collect();
        Bytes::of::<Self>()
            .put(
                offset_of!(Self, rr_position),
                &self.rr_position.to_ne_bytes(),
            )
            .put(
                offset_of!(Self, schedule_cursor),
                &self.schedule_cursor.to_ne_bytes(),
            )
            .put(offset_of!(Self, wrr_steps), &self.wrr_steps.to_ne_bytes())
            .put(offset_of!(Self, wrr_base), &base)
            .0
    }
}

impl PolicyState {
    /// One CPU's value as the kernel returns it.
    pub fn read(bytes: &[u8]) -> Self {
        let word = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
        let base = offset_of!(Self, wrr_base);
        PolicyState {
            rr_position: u32::from_ne_bytes(bytes[..4].try_into().unwrap()),
            schedule_cursor: u32::from_ne_bytes(bytes[4..8].try_into().unwrap()),
            wrr_steps: word(offset_of!(Self, wrr_steps)),
            wrr_base: std::array::from_fn(|i| word(base + 8 * i) as i64),
        }
    }

    /// The wrr credits this state stands for, given the VIP's weights.
    pub fn wrr_credits(&self, weights: &[u32]) -> Vec<i64> {
        weights
            .iter()
            .zip(&self.wrr_base)
            .map(|(&w, &base)| {
                (base as u64).wrapping_add(self.wrr_steps.wrapping_mul(w as u64)) as i64
            })
            .collect()
    }
}

/// `struct policy_rng`: one CPU's Xoshiro256++ state.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyRngState {
    pub s: [u64; 4],
}

impl Encode for PolicyRngState {
    fn to_bytes(&self) -> Vec<u8> {
        self.s.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }
}

/// `struct handshake_words`: the handshake table's slots, then its retry filter.
#[repr(C)]
pub struct HandshakeWords {
    pub slot: [std::sync::atomic::AtomicU64; HANDSHAKE_SLOTS],
    pub retry: [std::sync::atomic::AtomicU16; HANDSHAKE_RETRY_SLOTS],
}

/// One CPU's view of a server's loads, as pow2 and least loaded in the kernel compare
/// them: what userspace publishes into that CPU's `active_rows` entry (`active_base`) and
/// into `published_loads` (the rest, the same for every CPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerLoadValue {
    /// The active-connection total at the fold minus this CPU's `opened + moved_in -
    /// closed` then (wrapping): the kernel adds this CPU's counts since.
    pub active_base: i64,
    /// `f64::to_bits` of non-negative loads, +0.0 for zero: they order as the floats do.
    pub reported: u64,
    pub packet_rate: u64,
    pub byte_rate: u64,
}

/// `LOAD_METRICS`: entries of `published_loads`, one per `LOAD_METRIC_*`.
pub const LOAD_METRICS: usize = 4;

/// `struct active_load`: one server's entry in one CPU's row of `active_rows`. `base` is
/// userspace's word, `own` the CPU's program's.
#[repr(C)]
pub struct ActiveLoad {
    pub base: std::sync::atomic::AtomicI64,
    pub own: std::sync::atomic::AtomicU64,
}

/// `struct active_row`: one CPU's value of `active_rows`.
#[repr(C)]
pub struct ActiveRow {
    pub server: [ActiveLoad; SERVER_ID_SPACE],
}

/// `struct published_row`: one metric's value of `published_loads`.
#[repr(C)]
pub struct PublishedRow {
    pub server: [std::sync::atomic::AtomicU64; SERVER_ID_SPACE],
}

/// `struct close_words`: the one value of `closes`, the close filter's words.
#[repr(C)]
pub struct CloseWords {
    pub word: [u32; CLOSE_SLOTS],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_handled_in_the_kernel_counts_as_the_cores_straight_line_does() {
        for (stat, close) in [
            (STAT_FAST_SERVER_CLOSE, Counter::ServerCloses),
            (STAT_FAST_SERVER_DUPLICATE_CLOSE, Counter::DuplicateCloses),
        ] {
            let (_, counters) = FAST_EVENTS.iter().find(|(s, _)| *s == stat).unwrap();
            let mut expected = Bundle::ServerCookie.counters().to_vec();
            expected.push(close);
            assert_eq!(*counters, &expected[..]);
        }
    }

    #[test]
    fn values_are_their_fields_at_their_offsets() {
        let config = LbConfigValue {
            flags: LB_FAST_PATH,
            mode: LB_MODE_HASH,
            forwarding: LB_FORWARDING_NAT,
            id_bits: 12,
            copy: 1,
            id_mask: 0x0fff,
            pad2: 0xffff,
            generation: 7,
            publish_seq: 9,
            fallback_mask: 0x3f,
            maglev_size: 65_537,
            clock_base_ns: 0x0102_0304_0506_0708,
            vip_addr_filter: 0x1000_0000_0000_0001,
        };
        let bytes = config.to_bytes();
        assert_eq!(bytes.len(), 48);
        assert_eq!(bytes[..4], 1u32.to_ne_bytes());
        assert_eq!(bytes[4..8], [1, 1, 12, 1]);
        assert_eq!(bytes[8..10], 0x0fffu16.to_ne_bytes());
        assert_eq!(bytes[10..12], [0, 0]);
        assert_eq!(bytes[12..16], 7u32.to_ne_bytes());
        assert_eq!(bytes[16..20], 9u32.to_ne_bytes());
        assert_eq!(bytes[20..24], 0x3fu32.to_ne_bytes());
        assert_eq!(bytes[24..28], 65_537u32.to_ne_bytes());
        assert_eq!(bytes[32..40], 0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(bytes[40..], 0x1000_0000_0000_0001u64.to_ne_bytes());
        let key = VipKey {
            addr: [10, 0, 0, 100],
            port: 80u16.to_be_bytes(),
            protocol: 6,
            copy: 1,
        };
        assert_eq!(key.to_bytes(), [10, 0, 0, 100, 0, 80, 6, 1]);
        let words: Vec<u8> = (1u8..=6).flat_map(|w| [w, 0, 0, 0, 0, 0, 0, 0]).collect();
        let info = ServerTraffic::read(&words);
        let word = |w: u8| u64::from_ne_bytes([w, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            info,
            ServerTraffic {
                packets: word(1),
                bytes: word(2),
                opened: word(3),
                closed: word(4),
                moved_in: word(5),
                pad: 0,
            }
        );
    }
}
