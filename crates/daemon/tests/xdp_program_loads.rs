//! The XDP program (bpf/xdp_lb.c and bpf/lib/) as the kernel's verifier sees it: it loads,
//! every map has the type and sizes userspace relies on (the layouts of
//! bpf/include/cheetah_shared.h), and, run with BPF_PROG_TEST_RUN, an established client
//! segment and a server reply are forwarded in the kernel the way the core forwards them.
//! The comparison with the core over every test vector is tests/xdp_parity.rs. Needs root.

use std::os::fd::{AsFd, AsRawFd};

use cheetah_core::cookie::CookieLayout;
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::tables::vip_addr_bit;
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::ServerId;
use cheetah_core::wire::tcp::flags::ACK;
use cheetah_core::wire::{checksum, Ipv4Packet, TcpSegment};
use cheetah_daemon::dataplane::reply_senders;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_layout::{Encode, ReplyKey, ReplySender, ReplySlot};
use libbpf_rs::{MapCore, MapFlags, MapType, Object, ObjectBuilder};

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
use ip_command::ip;

/// The object `cheetah run` embeds (crates/daemon/build.rs).
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_lb.o"));
const PROGRAM_NAME: &str = "cheetah_lb";
/// The LB itself, the global function the program calls (bpf/lib/lb.h).
const DECIDE_NAME: &str = "cheetah_decide";

// cheetah_shared.h
const MAX_QUEUES: u32 = 64;
const MAX_INTERFACES: u32 = 16;
const SERVER_SIDE_SLOTS: u32 = 1024;
const MAX_HOST_ADDRS: u32 = 256;
const MAX_VIPS: u32 = 4096;
const SERVER_ID_SPACE: u32 = 16384;
const COOKIE_SPACE: u32 = 65536;
const MAX_HASH_POOL: usize = 64;
const STAT_COUNT: u32 = 98;
const STAT_SLOTS: u32 = 128;
const CLOSE_SLOTS: u32 = 65536;
const STAT_NO_SOCKET: u32 = 1;
const STAT_FAST_CLIENT_COOKIE: u32 = 4;
const STAT_FAST_SERVER_COOKIE: u32 = 6;
const LB_FAST_PATH: u32 = 1;
const SERVER_FORWARDS: u32 = 1;
const SERVER_EGRESS: u32 = 2;
const MSB_KNOWN: u32 = 1 << 16;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const IPPROTO_TCP: u8 = 6;
const LOOPBACK_IFINDEX: u32 = 1;

/// Sizes of the shared structs, as the C compiler lays them out (cheetah_shared.h).
const BACKEND_KEY: u32 = 8; // addr, port, copy
const BACKEND_INFO: u32 = 8; // server, vip_index, flags
const LB_CONFIG: u32 = 48; // flags, mode, forwarding, id_bits, copy, id_mask, pad2, generation, publish_seq, fallback_mask, maglev_size, (pad), clock_base_ns, vip_addr_filter
const FALLBACK_SET: u32 = 64; // way[8]
const VIP_KEY: u32 = 8; // addr, port, protocol, copy
const VIP_INFO: u32 = 176; // 4 x u64, addr, 5 x u16, pool[64], policy, pad[3]
const SERVER_INFO: u32 = 24; // flags, dip, egress_ifindex, dst_mac[6], src_mac[6]
const MAC_KEY: u32 = 8; // mac[6], copy
const REPLY_SLOT: u32 = 64; // key (addr, port, mac[6]), used, sender (hash_prefix[4], vip_addr, vip_port, server), pad
const REPLY_SLOTS: u32 = 65536;
const VIP_SLOT: u32 = 64; // tag, hash_prefix[4], port, backend_port, pad, pad2[2]
const VIP_SLOTS: u32 = 8192;
const STAT_REPLY_BY_STEERING: u32 = 32;
const SERVER_TRAFFIC: u32 = 48; // packets, bytes, opened, closed, moved_in, pad
const VIP_WEIGHTS: u32 = 264; // total, weight[64]
const POLICY_STATE: u32 = 528; // rr_position, pad, wrr_steps, wrr_base[64]
const POLICY_RNG: u32 = 32; // s[4]
const HANDSHAKE_WORDS: u32 = 8 * (1 << 18) + 2 * (1 << 12); // slot[2^18], retry[2^12]
const ACTIVE_ROW: u32 = 16 * SERVER_ID_SPACE; // (base, own) per server id
const PUBLISHED_ROW: u32 = 8 * SERVER_ID_SPACE; // one load per server id
const LOAD_METRICS: u32 = 4;
const NEXT_HOP_KEY: u32 = 12; // prefixlen, copy, addr
const ADDR_KEY: u32 = 8; // addr, copy (vip_addrs, next_hop_hosts)
                         // Copies of every published table (bpf/lib/publish.h): the published maps hold both.
const COPIES: u32 = 2;
const NEXT_HOP: u32 = 24; // kind, ifindex, mtu, dmac[6], smac[6]
const MAX_NEXT_HOPS: u32 = 16384;
const BPF_F_NO_PREALLOC: u32 = 1;

/// `struct vip_addr_key` of `addr` in copy 0 of the tables (the one a fresh lb_config's
/// word names).
fn vip_addr_key(addr: u32) -> [u8; ADDR_KEY as usize] {
    let mut key = [0u8; ADDR_KEY as usize];
    key[..4].copy_from_slice(&addr.to_be_bytes());
    key
}

fn load() -> Object {
    ObjectBuilder::default()
        .open_memory(PROGRAM)
        .expect("open the embedded object")
        .load()
        .expect("the verifier refused bpf/xdp_lb.c")
}

fn map<'a>(object: &'a Object, name: &str) -> libbpf_rs::Map<'a> {
    object
        .maps()
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("map {name} is missing"))
}

/// What the verifier made of the program: (instructions it processed, instructions loaded).
fn verifier_counts(object: &Object) -> (u32, u32) {
    let prog = object
        .progs()
        .find(|p| p.name() == PROGRAM_NAME)
        .expect("program cheetah_lb");
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a bpf_prog_info of `len` bytes, with no pointers asked for.
    let rc = unsafe {
        libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
            prog.as_fd().as_raw_fd(),
            &mut info,
            &mut len,
        )
    };
    assert_eq!(rc, 0, "bpf_prog_get_info_by_fd");
    (info.verified_insns, info.xlated_prog_len / 8)
}

/// The verifier's limit on a frame and the frames it calls, together (MAX_BPF_STACK).
const STACK_LIMIT: i32 = 512;
/// What least-loaded's bpf_loop callback adds to the frames on the SYN path.
const LEAST_LOADED_CALLBACK_FRAME: i32 = 16;
/// Room kept free beside them for what the next change needs.
const STACK_HEADROOM: i32 = 64;

/// The bytes of a function's own frame: the deepest offset from the frame pointer (r10)
/// that any of its instructions (8 bytes each, as in the object) reads or writes.
fn frame_bytes(insns: &[u8]) -> i32 {
    const FRAME_POINTER: u8 = 10;
    insns
        .chunks_exact(8)
        .filter_map(|insn| {
            let (code, regs) = (insn[0], insn[1]);
            let (dst, src) = (regs & 0x0f, regs >> 4);
            let off = i16::from_le_bytes([insn[2], insn[3]]);
            // LDX reads [src + off]; ST and STX write [dst + off].
            let base = match code & 0x07 {
                0x01 => src,
                0x02 | 0x03 => dst,
                _ => return None,
            };
            (base == FRAME_POINTER && off < 0).then(|| -i32::from(off))
        })
        .max()
        .unwrap_or(0)
}

/// The instructions of the function `name` in the object: its symbol's bytes in its
/// section (ELF64, little-endian, as clang writes BPF objects).
fn function_insns<'a>(object: &'a [u8], name: &str) -> &'a [u8] {
    let u16_at = |at: usize| u16::from_le_bytes(object[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(object[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(object[at..at + 8].try_into().unwrap()) as usize;
    let (sections, entry, count) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| {
        let header = sections + i * entry;
        // (type, offset, size, link)
        (
            u32_at(header + 4),
            u64_at(header + 0x18),
            u64_at(header + 0x20),
            u32_at(header + 0x28),
        )
    };
    const SYMTAB: usize = 2;
    const SYMBOL_LEN: usize = 24;
    let (_, symbols, symbols_len, names) = (0..count)
        .map(section)
        .find(|(kind, ..)| *kind == SYMTAB)
        .expect("a symbol table");
    let (_, names_at, ..) = section(names);
    (symbols..symbols + symbols_len)
        .step_by(SYMBOL_LEN)
        .find_map(|symbol| {
            let name_at = names_at + u32_at(symbol);
            let end = name_at + object[name_at..].iter().position(|b| *b == 0)?;
            if &object[name_at..end] != name.as_bytes() {
                return None;
            }
            let (_, data, ..) = section(u16_at(symbol + 6));
            let (value, size) = (u64_at(symbol + 8), u64_at(symbol + 16));
            Some(&object[data + value..data + value + size])
        })
        .unwrap_or_else(|| panic!("no function {name} in the object"))
}

#[test]
fn the_programs_frame_leaves_room_beside_least_loadeds_callback() {
    // The program (vlan.h's wrapper) calls the LB, a global function (lb.h), which calls
    // least-loaded's callback: the verifier adds their frames.
    let frames: Vec<(&str, i32)> = [PROGRAM_NAME, DECIDE_NAME]
        .into_iter()
        .map(|name| (name, frame_bytes(function_insns(PROGRAM, name))))
        .collect();
    eprintln!("frames: {frames:?}");
    let decide = frames[1].1;
    assert!(decide > 0, "no instruction of {DECIDE_NAME} uses its frame");
    let frame: i32 = frames.iter().map(|(_, bytes)| bytes).sum();
    // Over the limit the program does not load ("combined stack size of 3 calls"); at it,
    // the next local on a path to the SYN path breaks the load.
    assert!(
        frame + LEAST_LOADED_CALLBACK_FRAME + STACK_HEADROOM <= STACK_LIMIT,
        "the frames {frames:?} add up to {frame} bytes: with least-loaded's callback ({LEAST_LOADED_CALLBACK_FRAME}) less than {STACK_HEADROOM} of the verifier's {STACK_LIMIT} are left; move cold state to a per-CPU *_scratch entry (fast_path.h reply_scratch)"
    );
}

#[test]
fn the_verifier_takes_the_program_and_its_maps_are_the_contracts() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    // The daemon's own loader takes it, and sizes the fallback table as the core rounds
    // the config's capacity: 1000 flows -> 1024 -> 128 sets.
    let sized = SteeringProgram::load(1000).expect("SteeringProgram::load");
    assert_eq!(sized.try_map("fallback").unwrap().max_entries(), 128);
    assert_eq!(sized.fallback_words().unwrap().capacity(), 1024);
    // And gives every possible CPU its row of the load view.
    assert_eq!(
        sized.try_map("active_rows").unwrap().max_entries() as usize,
        libbpf_rs::num_possible_cpus().unwrap()
    );

    let object = load();
    let (verified, loaded) = verifier_counts(&object);
    eprintln!("cheetah_lb: {loaded} instructions loaded, {verified} processed by the verifier");
    // The verifier refuses a program once it has processed 1,000,000 instructions
    // (BPF_COMPLEXITY_LIMIT_INSNS). Merged, stage 4 once reached 935,426 (a pointer into
    // either a map value or the stack kept two ways of the reply path apart): fail here,
    // with room left, rather than at the next change's load.
    assert!(
        verified < 850_000,
        "the verifier processed {verified} instructions of its 1,000,000: keep paths whose states cannot be pruned together apart, or move cold ones to a bpf_loop callback or global function"
    );

    let expected: [(&str, MapType, u32, u32, u32, u32); 33] = [
        (
            "xsks",
            MapType::Xskmap,
            4,
            4,
            MAX_INTERFACES * MAX_QUEUES,
            0,
        ),
        ("interface_slots", MapType::Hash, 4, 4, MAX_INTERFACES, 0),
        (
            "vip_addrs",
            MapType::Hash,
            ADDR_KEY,
            4,
            COPIES * MAX_VIPS,
            0,
        ),
        (
            "backends",
            MapType::Hash,
            BACKEND_KEY,
            BACKEND_INFO,
            COPIES * 65536,
            0,
        ),
        ("host_addrs", MapType::Hash, 4, 4, MAX_HOST_ADDRS, 0),
        ("stats", MapType::PercpuArray, 4, 8, STAT_SLOTS, 0),
        (
            "lb_config",
            MapType::Array,
            4,
            LB_CONFIG,
            COPIES,
            BPF_F_MMAPABLE,
        ),
        (
            "vips",
            MapType::Hash,
            VIP_KEY,
            VIP_INFO,
            COPIES * MAX_VIPS,
            0,
        ),
        (
            "vips_by_index",
            MapType::Array,
            4,
            VIP_INFO,
            COPIES * MAX_VIPS,
            0,
        ),
        (
            "vip_slots",
            MapType::Array,
            4,
            VIP_SLOT,
            COPIES * VIP_SLOTS,
            0,
        ),
        (
            "servers",
            MapType::Array,
            4,
            SERVER_INFO,
            COPIES * SERVER_ID_SPACE,
            0,
        ),
        (
            "server_macs",
            MapType::Hash,
            MAC_KEY,
            4,
            COPIES * SERVER_ID_SPACE,
            0,
        ),
        (
            "reply_senders",
            MapType::Array,
            4,
            REPLY_SLOT,
            COPIES * REPLY_SLOTS,
            0,
        ),
        (
            "server_side",
            MapType::Array,
            4,
            4,
            COPIES * SERVER_SIDE_SLOTS,
            0,
        ),
        // One entry each, every word in it (an array's entries are 8 bytes apart).
        (
            "msb_seen",
            MapType::Array,
            4,
            4 * SERVER_ID_SPACE,
            1,
            BPF_F_MMAPABLE,
        ),
        (
            "msb_restores",
            MapType::Array,
            4,
            4 * COOKIE_SPACE,
            1,
            BPF_F_MMAPABLE,
        ),
        // The rest of the clock table's words (struct msb_clock_words): anchors and
        // limits (8 bytes a server), estimates (4), probed (1), the count of writes.
        (
            "msb_clock",
            MapType::Array,
            4,
            (8 + 8 + 4 + 1) * SERVER_ID_SPACE + 8,
            1,
            BPF_F_MMAPABLE,
        ),
        // The core's close filter, DEFAULT_SLOTS words (lb/closes.rs).
        (
            "closes",
            MapType::Array,
            4,
            4 * CLOSE_SLOTS,
            1,
            BPF_F_MMAPABLE,
        ),
        // One set per entry, sized at load time (one entry as compiled).
        (
            "fallback",
            MapType::Array,
            4,
            FALLBACK_SET,
            1,
            BPF_F_MMAPABLE,
        ),
        (
            "server_traffic",
            MapType::PercpuArray,
            4,
            SERVER_TRAFFIC,
            SERVER_ID_SPACE,
            0,
        ),
        (
            "vip_weights",
            MapType::Array,
            4,
            VIP_WEIGHTS,
            COPIES * MAX_VIPS,
            0,
        ),
        (
            "policy_state",
            MapType::PercpuArray,
            4,
            POLICY_STATE,
            MAX_VIPS,
            0,
        ),
        ("policy_rng", MapType::PercpuArray, 4, POLICY_RNG, 1, 0),
        // Each CPU's load view (kernel_loads.rs): a row per CPU (sized at load; one
        // unsized) and a row per metric.
        (
            "active_rows",
            MapType::Array,
            4,
            ACTIVE_ROW,
            1,
            BPF_F_MMAPABLE,
        ),
        (
            "published_loads",
            MapType::Array,
            4,
            PUBLISHED_ROW,
            LOAD_METRICS,
            BPF_F_MMAPABLE,
        ),
        (
            "handshakes",
            MapType::Array,
            4,
            HANDSHAKE_WORDS,
            1,
            BPF_F_MMAPABLE,
        ),
        (
            "next_hops",
            MapType::LpmTrie,
            NEXT_HOP_KEY,
            NEXT_HOP,
            COPIES * MAX_NEXT_HOPS,
            0,
        ),
        (
            "next_hop_hosts",
            MapType::Hash,
            ADDR_KEY,
            NEXT_HOP,
            COPIES * MAX_NEXT_HOPS,
            0,
        ),
        // The kernel's alone (bpf/lib/maps.h): {client, publish_seq, struct next_hop}
        // per slot, 2^12 slots per CPU.
        (
            "next_hop_cache",
            MapType::PercpuArray,
            4,
            8 + NEXT_HOP,
            4096,
            0,
        ),
        // One packet's scratch space, per CPU: the options' walk (40 option bytes and
        // three words), a FIB lookup's parameters (struct bpf_fib_lookup) and a reply's
        // cold decisions (struct reply_cold: a clock learnt, a handshake answered, a close;
        // and when the CPU last sent a clock anomaly up).
        ("option_walk_scratch", MapType::PercpuArray, 4, 52, 1, 0),
        ("fib_scratch", MapType::PercpuArray, 4, 64, 1, 0),
        ("reply_scratch", MapType::PercpuArray, 4, 88, 1, 0),
        // VIP index -> the fd of its Maglev table's inner array (made by the publisher).
        (
            "maglev_tables",
            MapType::ArrayOfMaps,
            4,
            4,
            COPIES * MAX_VIPS,
            0,
        ),
    ];
    for (name, kind, key_size, value_size, max_entries, flags) in expected {
        let map = map(&object, name);
        assert_eq!(map.map_type(), kind, "{name}: type");
        assert_eq!(map.key_size(), key_size, "{name}: key size");
        assert_eq!(map.value_size(), value_size, "{name}: value size");
        assert_eq!(map.max_entries(), max_entries, "{name}: max_entries");
        let info = map.info().expect("map info");
        if kind == MapType::LpmTrie {
            // The kernel refuses an LPM trie without it.
            assert_eq!(info.info.map_flags & BPF_F_NO_PREALLOC, BPF_F_NO_PREALLOC);
        }
        assert_eq!(
            info.info.map_flags & BPF_F_MMAPABLE,
            flags,
            "{name}: BPF_F_MMAPABLE"
        );
    }
}

fn stat(object: &Object, index: u32) -> u64 {
    assert!(index < STAT_COUNT, "stat {index} is no counter");
    map(object, "stats")
        .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)
        .expect("stats lookup")
        .expect("stats entry")
        .iter()
        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
        .sum()
}

fn put(object: &Object, name: &str, key: &[u8], value: &[u8]) {
    map(object, name)
        .update(key, value, MapFlags::ANY)
        .unwrap_or_else(|e| panic!("update {name}: {e}"));
}

/// Sets word `index` of a clock map (one entry of `words` words; every other word 0).
fn put_clock_word(object: &Object, name: &str, words: u32, index: u32, value: u32) {
    let mut all = vec![0u8; 4 * words as usize];
    let at = 4 * index as usize;
    all[at..at + 4].copy_from_slice(&value.to_ne_bytes());
    put(object, name, &0u32.to_ne_bytes(), &all);
}

/// Runs `frame` through the program as if it arrived on lo (BPF_PROG_TEST_RUN's device):
/// the verdict and the bytes it left.
// `ProgramInput` is non-exhaustive: no struct literal outside libbpf-rs.
#[allow(clippy::field_reassign_with_default)]
fn run(object: &mut Object, frame: &[u8]) -> (u32, Vec<u8>) {
    let prog = object
        .progs_mut()
        .find(|p| p.name() == PROGRAM_NAME)
        .expect("program cheetah_lb");
    let mut out = vec![0u8; frame.len() + 256];
    let mut input = libbpf_rs::ProgramInput::default();
    input.data_in = Some(frame);
    input.data_out = Some(&mut out);
    let output = prog.test_run(input).expect("BPF_PROG_TEST_RUN");
    let data = output.data.expect("data out").to_vec();
    (output.return_value, data)
}

/// The maps as the publisher fills them for the testkit's VIP (cheetah mode, the default
/// cookie layout; `nat`: forwarding to the servers' `backend_port`) and one server reached
/// through lo: the server's MAC and the egress interface's.
fn publish(
    object: &Object,
    hasher: &FlowHasher,
    server: ServerId,
    nat: bool,
    backend_port: u16,
) -> ([u8; 6], [u8; 6]) {
    let layout = CookieLayout::DEFAULT;
    let mut config = [0u8; LB_CONFIG as usize];
    config[0..4].copy_from_slice(&LB_FAST_PATH.to_ne_bytes());
    config[4] = 0; // LB_MODE_CHEETAH
    config[5] = nat as u8; // LB_FORWARDING_L2 or LB_FORWARDING_NAT
    config[6] = layout.id_bits();
    config[8..10].copy_from_slice(&layout.max_server_id().to_ne_bytes());
    config[40..48].copy_from_slice(&vip_addr_bit(VIP).to_ne_bytes());
    put(object, "lb_config", &0u32.to_ne_bytes(), &config);

    let mut vip_key = [0u8; VIP_KEY as usize];
    vip_key[0..4].copy_from_slice(&VIP.to_be_bytes());
    vip_key[4..6].copy_from_slice(&VIP_PORT.to_be_bytes());
    vip_key[6] = IPPROTO_TCP;
    let mut vip = [0u8; VIP_INFO as usize];
    let prefix = hasher.vip_prefix(VIP, VIP_PORT, IPPROTO_TCP).state();
    for (i, word) in prefix.iter().enumerate() {
        vip[i * 8..i * 8 + 8].copy_from_slice(&word.to_ne_bytes());
    }
    vip[32..36].copy_from_slice(&VIP.to_be_bytes());
    vip[36..38].copy_from_slice(&VIP_PORT.to_be_bytes());
    vip[38..40].copy_from_slice(&backend_port.to_be_bytes());
    assert!(44 + 2 * MAX_HASH_POOL <= vip.len());
    put(object, "vips", &vip_key, &vip);

    let server_mac = testkit::server_mac(server.0);
    let egress_mac = [0x02, 0, 0, 0, 0xee, 0x01];
    let mut info = [0u8; SERVER_INFO as usize];
    info[0..4].copy_from_slice(&(SERVER_FORWARDS | SERVER_EGRESS).to_ne_bytes());
    info[4..8].copy_from_slice(&testkit::server_dip(server.0).to_be_bytes());
    info[8..12].copy_from_slice(&LOOPBACK_IFINDEX.to_ne_bytes());
    info[12..18].copy_from_slice(&server_mac);
    info[18..24].copy_from_slice(&egress_mac);
    put(object, "servers", &(server.0 as u32).to_ne_bytes(), &info);

    (server_mac, egress_mac)
}

// Frame offsets of the checksums of an untagged IPv4 frame without IP options.
const IP_CHECKSUM: usize = 14 + 10;
const TCP_CHECKSUM: usize = 34 + 16;

// `enum xdp_action`.
const XDP_DROP: u32 = 1;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

/// An established client ACK with NOP NOP TS, echoing a cookie of server 7: with the fast
/// path off the program steers it as before (no socket: dropped, counted); with it on, the
/// kernel forwards it as the core's straight line does (l2 and NAT, valid checksums and
/// both encodings of zero): TSecr's high half restored to the server's MSB, toward the
/// server's MAC, counted as a cookie-routed client packet.
#[test]
fn an_established_client_segment_is_forwarded_in_the_kernel() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let mut object = load();
    let layout = CookieLayout::DEFAULT;
    let secret = Secret(*b"xdp-smoke-secret");
    let hasher = FlowHasher::new(&secret);
    let server = ServerId(7);
    let server_msb: u16 = 0x1234;
    let (client, client_port) = (testkit::client_ip(1), 40000);
    let hash = hasher.hash(&FlowKey::tcp(client, client_port, VIP, VIP_PORT));
    let cookie = layout.encode(server, hash, server_msb);
    let tsecr = (cookie as u32) << 16 | 0x5678;
    let frame =
        TcpFrame::from_client(client, client_port, ACK, options::nop_nop_ts(99, tsecr)).build();
    assert_eq!(testkit::timestamps(&frame), Some((99, tsecr)));

    // Fast path off (lb_config as loaded): today's steering, no socket bound.
    put(
        &object,
        "vip_addrs",
        &vip_addr_key(VIP),
        &0u32.to_ne_bytes(),
    );
    let no_socket = stat(&object, STAT_NO_SOCKET);
    let (verdict, bytes) = run(&mut object, &frame);
    assert_eq!(verdict, XDP_DROP);
    assert_eq!(bytes, frame, "steering changes no byte");
    assert_eq!(stat(&object, STAT_NO_SOCKET), no_socket + 1);

    // The clock table's restore entry for this cookie: the server's MSB, network order.
    let unmasked = layout.unmask(cookie, hash).0 as u32;
    let entry = MSB_KNOWN | server_msb.to_be() as u32;
    put_clock_word(&object, "msb_restores", COOKIE_SPACE, unmasked, entry);
    let (_, tsecr_at) = testkit::timestamp_offsets(&frame).unwrap();

    for (nat, backend_port) in [(false, VIP_PORT), (true, 8080)] {
        let (server_mac, egress_mac) = publish(&object, &hasher, server, nat, backend_port);
        // fast_path.rs `client_fast` and client_path.rs `forward_to_server_via`, with the
        // worker's egress step (the source MAC).
        let core_bytes = |frame: &[u8]| {
            let mut expected = frame.to_vec();
            checksum::replace_high_half_in_network_order(
                &mut expected,
                tsecr_at,
                TCP_CHECKSUM,
                server_msb.to_be(),
            );
            expected[0..6].copy_from_slice(&server_mac);
            expected[6..12].copy_from_slice(&egress_mac);
            if nat {
                let dip = testkit::server_dip(server.0);
                let old = Ipv4Packet::new_unchecked(&mut expected[14..]).set_dst(dip);
                let mut segment = TcpSegment::new_unchecked(&mut expected[34..]);
                segment.update_checksum_for_address(old, dip);
                segment.set_dst_port(backend_port);
            }
            expected
        };
        let with_checksums = |ip_sum: u16, tcp_sum: u16| {
            let mut frame = frame.clone();
            frame[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&ip_sum.to_be_bytes());
            frame[TCP_CHECKSUM..TCP_CHECKSUM + 2].copy_from_slice(&tcp_sum.to_be_bytes());
            frame
        };
        // The checksums that the core's updates turn into 0x0000 (the encoding of zero
        // that RFC 1624's eqn. 3 can give and another formula might not).
        let to_zero = |at: usize| {
            (0..=0xffff)
                .find(|&sum: &u16| {
                    let mut frame = frame.clone();
                    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
                    core_bytes(&frame)[at..at + 2] == [0, 0]
                })
                .unwrap()
        };
        let (ip_to_zero, tcp_to_zero) = (to_zero(IP_CHECKSUM), to_zero(TCP_CHECKSUM));
        // As built, then with checksums at both encodings of zero, then with the ones
        // that end at zero: the kernel's incremental updates must give the core's bytes
        // in every case, not only for valid checksums.
        let built = u16::from_be_bytes([frame[IP_CHECKSUM], frame[IP_CHECKSUM + 1]]);
        let cases = [
            (
                built,
                u16::from_be_bytes([frame[TCP_CHECKSUM], frame[TCP_CHECKSUM + 1]]),
            ),
            (0x0000, 0xffff),
            (0xffff, 0x0000),
            (if nat { ip_to_zero } else { built }, tcp_to_zero),
        ];
        for (case, (ip_sum, tcp_sum)) in cases.into_iter().enumerate() {
            let frame = with_checksums(ip_sum, tcp_sum);
            let expected = core_bytes(&frame);
            let routed = stat(&object, STAT_FAST_CLIENT_COOKIE);
            let (verdict, bytes) = run(&mut object, &frame);
            assert_eq!(verdict, XDP_TX, "egress is the interface it came in on");
            assert_eq!(stat(&object, STAT_FAST_CLIENT_COOKIE), routed + 1);
            assert_eq!(
                bytes, expected,
                "nat {nat}, checksums {ip_sum:#x} {tcp_sum:#x}"
            );
            if case == 0 {
                assert_eq!(
                    testkit::timestamps(&bytes),
                    Some((99, (server_msb as u32) << 16 | 0x5678)),
                    "TSecr's high half is the server's MSB again"
                );
                assert!(testkit::checksums_valid(&bytes), "checksums still verify");
            }
        }
    }
}

/// A server's established reply with NOP NOP TS, its MSB the newest seen: the kernel asks
/// the FIB for the way to the client (in a namespace of this test's thread, where the
/// client sits behind `xr0` with a permanent neighbour entry), writes the cookie into
/// TSval's high half and redirects it there with the neighbour's MAC. Its sender is found
/// either way the program knows: by steering and `server_macs`, or in one `reply_senders`
/// lookup, with the same bytes; and `reply_senders` takes nothing that only claims to be
/// the server's reply (another MAC, another port, to a VIP's address, or on the clients'
/// side).
#[test]
fn a_server_reply_gets_its_cookie_in_the_kernel() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program, a network namespace) ***\n");
        return;
    }
    // SAFETY: unshare only changes this thread's namespaces.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    let (client, client_port) = (testkit::client_ip(1), 40000);
    let client_mac = [0x02, 0, 0, 0, 0xc1, 0x01];
    ip(&["link", "set", "lo", "up"]);
    ip(&["link", "add", "xr0", "type", "veth", "peer", "name", "xr1"]);
    ip(&["link", "set", "xr0", "address", "02:00:00:00:ee:02"]);
    ip(&["link", "set", "xr0", "up"]);
    ip(&["link", "set", "xr1", "up"]);
    ip(&["addr", "add", "10.2.0.254/24", "dev", "xr0"]);
    let client_text = std::net::Ipv4Addr::from(client).to_string();
    ip(&[
        "neigh",
        "replace",
        &client_text,
        "lladdr",
        "02:00:00:00:c1:01",
        "dev",
        "xr0",
        "nud",
        "permanent",
    ]);
    // A way to the VIP's address too, so that a segment to it that only claims to be a
    // reply would have a next hop if it were taken.
    let vip_text = std::net::Ipv4Addr::from(VIP).to_string();
    ip(&["route", "add", &format!("{vip_text}/32"), "dev", "xr0"]);
    ip(&[
        "neigh",
        "replace",
        &vip_text,
        "lladdr",
        "02:00:00:00:c1:02",
        "dev",
        "xr0",
        "nud",
        "permanent",
    ]);
    // The FIB helper answers only for an input device that forwards (steer.h).
    std::fs::write("/proc/sys/net/ipv4/conf/lo/forwarding", "1").expect("lo forwarding");
    // SAFETY: a NUL-terminated name.
    let xr0 = unsafe { libc::if_nametoindex(c"xr0".as_ptr()) };
    assert_ne!(xr0, 0, "xr0's ifindex");

    let mut object = load();
    let layout = CookieLayout::DEFAULT;
    let hasher = FlowHasher::new(&Secret(*b"xdp-smoke-secret"));
    let server = ServerId(7);
    let server_msb: u16 = 0x1234;
    let (server_mac, _) = publish(&object, &hasher, server, false, VIP_PORT);
    put(
        &object,
        "vip_addrs",
        &vip_addr_key(VIP),
        &0u32.to_ne_bytes(),
    );
    put(
        &object,
        "server_side",
        &(LOOPBACK_IFINDEX % SERVER_SIDE_SLOTS).to_ne_bytes(),
        &LOOPBACK_IFINDEX.to_ne_bytes(),
    );
    let mut mac_key = [0u8; MAC_KEY as usize];
    mac_key[..6].copy_from_slice(&server_mac);
    put(
        &object,
        "server_macs",
        &mac_key,
        &(server.0 as u32).to_ne_bytes(),
    );
    let seen = MSB_KNOWN | server_msb as u32;
    put_clock_word(&object, "msb_seen", SERVER_ID_SPACE, server.0 as u32, seen);

    let tsval = (server_msb as u32) << 16 | 0x0042;
    let frame = TcpFrame::from_server_l2(
        server.0,
        client,
        client_port,
        ACK,
        options::nop_nop_ts(tsval, 77),
    )
    .build();
    let written = stat(&object, STAT_FAST_SERVER_COOKIE);
    let (verdict, bytes) = run(&mut object, &frame);
    assert_eq!(verdict, XDP_REDIRECT, "toward xr0 ({xr0}), not lo");
    assert_eq!(stat(&object, STAT_FAST_SERVER_COOKIE), written + 1);
    let hash = hasher.hash(&FlowKey::tcp(client, client_port, VIP, VIP_PORT));
    let cookie = layout.encode(server, hash, server_msb);
    assert_eq!(
        testkit::timestamps(&bytes),
        Some(((cookie as u32) << 16 | 0x0042, 77)),
        "TSval's high half is the cookie"
    );
    assert_eq!(bytes[0..6], client_mac, "the neighbour's MAC");
    assert_eq!(bytes[6..12], [0x02, 0, 0, 0, 0xee, 0x02], "xr0's MAC");
    assert!(testkit::checksums_valid(&bytes), "checksums still verify");
    assert_eq!(
        stat(&object, STAT_REPLY_BY_STEERING),
        1,
        "reply_senders is empty: found by steering"
    );

    // The same reply by reply_senders alone: the old way's server_macs entry gone.
    // At the slot the publisher's hash gives: the kernel's must be the same.
    let reply_key = ReplyKey {
        addr: VIP.to_be_bytes(),
        port: VIP_PORT.to_be_bytes(),
        mac: server_mac,
    };
    let slot = ReplySlot {
        key: reply_key,
        used: 1,
        sender: ReplySender {
            hash_prefix: hasher.vip_prefix(VIP, VIP_PORT, IPPROTO_TCP).state(),
            vip_addr: VIP.to_be_bytes(),
            vip_port: VIP_PORT.to_be_bytes(),
            server: server.0,
        },
        pad: 0,
    };
    assert_eq!(slot.to_bytes().len(), REPLY_SLOT as usize);
    let at = reply_senders::slot_of(&reply_key) as u32;
    put(
        &object,
        "reply_senders",
        &at.to_ne_bytes(),
        &slot.to_bytes(),
    );
    map(&object, "server_macs")
        .delete(&mac_key)
        .expect("delete server_macs");
    let (verdict, by_map) = run(&mut object, &frame);
    assert_eq!(verdict, XDP_REDIRECT);
    assert_eq!(by_map, bytes, "the same bytes as the old way's");
    assert_eq!(stat(&object, STAT_FAST_SERVER_COOKIE), written + 2);
    assert_eq!(stat(&object, STAT_REPLY_BY_STEERING), 1, "not by steering");

    // What only claims to be that reply is not taken (nor by the old way, which has no
    // server_macs entry now): it goes up unchanged.
    let claims = |change: &dyn Fn(&mut TcpFrame)| {
        let mut claim = TcpFrame::from_server_l2(
            server.0,
            client,
            client_port,
            ACK,
            options::nop_nop_ts(tsval, 77),
        );
        change(&mut claim);
        claim.build()
    };
    let another_mac = claims(&|f| f.src_mac = testkit::server_mac(8));
    let another_port = claims(&|f| f.src_port = VIP_PORT + 1);
    let to_a_vip = claims(&|f| f.dst_ip = VIP);
    for (what, claim) in [
        ("another server's MAC", another_mac),
        ("another source port", another_port),
        ("to a VIP's address", to_a_vip),
    ] {
        let (verdict, out) = run(&mut object, &claim);
        assert_eq!(verdict, XDP_DROP, "{what}: steered, no socket bound");
        assert_eq!(out, claim, "{what}: unchanged");
        assert_eq!(
            stat(&object, STAT_FAST_SERVER_COOKIE),
            written + 2,
            "{what}: not handled in the kernel"
        );
    }
    // The same reply on an interface that does not face the servers.
    put(
        &object,
        "server_side",
        &(LOOPBACK_IFINDEX % SERVER_SIDE_SLOTS).to_ne_bytes(),
        &0u32.to_ne_bytes(),
    );
    let (verdict, out) = run(&mut object, &frame);
    assert_eq!(verdict, XDP_DROP, "on the clients' side: steered");
    assert_eq!(out, frame, "on the clients' side: unchanged");
    assert_eq!(stat(&object, STAT_FAST_SERVER_COOKIE), written + 2);
}
