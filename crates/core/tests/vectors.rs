//! Shared test vectors: the core's exact output for chosen packets, as files another data
//! path (the XDP program, in C) can be held to byte for byte.
//!
//! The inputs are defined here with `testkit`; the expected outputs are what the core
//! produced when the files were last regenerated. By default this test LOADS the committed
//! files under `testdata/vectors/`, checks that their inputs are still the ones defined here,
//! and runs every vector through a fresh pipeline comparing verdict and bytes. With
//! `CHEETAH_REGEN_VECTORS=1` it rewrites the files from the core's current output instead
//! (review the diff: a changed output is a behaviour change). See docs/test-vectors.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cheetah_core::config::{ConfiguredState, Forwarding, LbConfig, Mode, VipConfig};
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::lb::{Ingress, Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::{ServerId, NANOS_PER_SEC};
use cheetah_core::verdict::Verdict;
use cheetah_core::wire::ip_proto;
use cheetah_core::wire::tcp::flags;
use serde::{Deserialize, Serialize};

/// One file of vectors: `vectors.toml` of a suite.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorFile {
    /// Servers removed through the control plane (at time 0) before every vector, for
    /// states the config file cannot express. The XDP side marks them removed in its
    /// server table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed_servers: Vec<u16>,
    vector: Vec<Vector>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    name: String,
    description: String,
    now_ns: u64,
    /// Per server, M^: the LB's estimate of the server's timestamp MSB now, imported into
    /// the MSB table (as the TSval `msb << 16`) before the packet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    msb_state: Vec<MsbEntry>,
    /// Packets processed first, on the same worker (their verdicts are checked too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    prelude: Vec<PreludePacket>,
    packet_in: String,
    verdict: String,
    packet_out: String,
    /// For `to_all_servers`: each copy after `prepare_copy`, in `copy_targets` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    copies: Vec<CopyOut>,
    /// Echoes restored more than 2^(k-1) periods behind M^ (`echoes_beyond_idle_limit`),
    /// counted over the prelude and the packet: such a connection's next server segment
    /// may be dropped by the client's PAWS check, which an operator should be able to see.
    #[serde(default, skip_serializing_if = "is_zero")]
    echoes_beyond_idle_limit: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MsbEntry {
    server: u16,
    msb: u16,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PreludePacket {
    now_ns: u64,
    packet_in: String,
    verdict: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CopyOut {
    server: u16,
    packet_out: String,
}

/// A vector's input as defined in code.
struct Input {
    name: String,
    description: String,
    msb: Vec<(u16, u16)>,
    prelude: Vec<Vec<u8>>,
    packet: Vec<u8>,
}

fn input(name: impl Into<String>, description: impl Into<String>, packet: Vec<u8>) -> Input {
    Input {
        name: name.into(),
        description: description.into(),
        msb: Vec::new(),
        prelude: Vec::new(),
        packet,
    }
}

impl Input {
    fn msb(mut self, server: u16, msb: u16) -> Self {
        self.msb.push((server, msb));
        self
    }

    fn after(mut self, packet: Vec<u8>) -> Self {
        self.prelude.push(packet);
        self
    }
}

struct Suite {
    name: &'static str,
    config: LbConfig,
    removed_servers: Vec<u16>,
    inputs: Vec<Input>,
}

/// All vectors run at this time; preludes at one millisecond steps before it.
const NOW: u64 = 10 * NANOS_PER_SEC;
const PRELUDE_STEP: u64 = 1_000_000;
const SECRET: Secret = Secret([
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
]);
const CLIENT_PORT: u16 = 40_000;
const BACKEND_PORT: u16 = 8080;
const CLIENT_TS: u32 = 0x0102_0304;
/// The server's clock: MSB 0x1234, epoch 4 at k = 4 (neither 0 nor the top epoch, so an
/// off-by-one in either direction shows).
const SERVER_TS: u32 = 0x1234_5678;
const M: u16 = 0x1234;
const ROUTER: u32 = 0x0a09_0001;

fn client() -> u32 {
    testkit::client_ip(7)
}

fn flow_hash(vip_port: u16) -> u64 {
    FlowHasher::new(&SECRET).hash(&FlowKey {
        client_ip: client(),
        vip_ip: testkit::VIP,
        client_port: CLIENT_PORT,
        vip_port,
        protocol: ip_proto::TCP,
    })
}

/// The timestamp a client echoes after `server` sent it a TSval with MSB `msb` and the
/// given low 16 bits, under the default layout.
fn cookie_ts(server: u16, msb: u16, low: u16) -> u32 {
    cookie_ts_in(CookieLayout::DEFAULT, server, msb, low)
}

fn cookie_ts_in(layout: CookieLayout, server: u16, msb: u16, low: u16) -> u32 {
    let cookie = layout.encode(ServerId(server), flow_hash(testkit::VIP_PORT), msb);
    tcp_ts::insert(u32::from(low), cookie)
}

fn from_client(flags: u8, options: Vec<u8>) -> TcpFrame {
    TcpFrame::from_client(client(), CLIENT_PORT, flags, options)
}

fn from_server(nat: bool, server: u16, flags: u8, options: Vec<u8>) -> TcpFrame {
    if nat {
        TcpFrame {
            src_port: BACKEND_PORT,
            ..TcpFrame::from_server_nat(server, client(), CLIENT_PORT, flags, options)
        }
    } else {
        TcpFrame::from_server_l2(server, client(), CLIENT_PORT, flags, options)
    }
}

/// Established options without a timestamp: NOP NOP SACK (one block), as a connection
/// that negotiated SACK but not timestamps sends them.
fn nop_nop_sack() -> Vec<u8> {
    vec![1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2]
}

/// Where a server's FIN sits: after the data of [`server_fin`], which starts at the
/// testkit's server sequence number.
const SERVER_FIN_SEQ: u32 = 2000 + SERVER_FIN_DATA.len() as u32;
const SERVER_FIN_DATA: &[u8] = b"bye\r\n";

/// Server 2's FIN-ACK with its last data (the close is one past the data).
fn server_fin(nat: bool) -> Vec<u8> {
    from_server(
        nat,
        2,
        flags::FIN | flags::ACK,
        options::nop_nop_ts(SERVER_TS + 3, CLIENT_TS + 2),
    )
    .with_payload(SERVER_FIN_DATA)
    .build()
}

/// [`server_fin`] of a connection without timestamps: no options.
fn server_fin_without_timestamp(nat: bool) -> Vec<u8> {
    from_server(nat, 2, flags::FIN | flags::ACK, Vec::new())
        .with_payload(SERVER_FIN_DATA)
        .build()
}

/// A SYN-ACK from the client's address (SYN-flood backscatter, a VIP's address spoofed),
/// Linux's layout, echoing `tsecr`.
fn client_syn_ack(tsecr: u32) -> Vec<u8> {
    from_client(
        flags::SYN | flags::ACK,
        options::linux_syn(CLIENT_TS, tsecr),
    )
    .build()
}

fn client_ack(tsecr: u32) -> Vec<u8> {
    from_client(
        flags::ACK | flags::PSH,
        options::nop_nop_ts(CLIENT_TS + 1, tsecr),
    )
    .with_payload(b"GET / HTTP/1.1\r\n\r\n")
    .build()
}

/// What the client received from the VIP, cookie in TSval (quoted by ICMP errors).
fn seen_by_client(server: u16) -> Vec<u8> {
    seen_by_client_with(options::nop_nop_ts(
        cookie_ts(server, M, 0x5678),
        CLIENT_TS + 1,
    ))
}

/// A data segment from the VIP as the client sees it, with these options.
fn seen_by_client_with(options: Vec<u8>) -> Vec<u8> {
    TcpFrame::from_server_l2(2, client(), CLIENT_PORT, flags::ACK, options)
        .with_payload(&[0x42; 100])
        .build()
}

fn syn(options: Vec<u8>) -> Vec<u8> {
    from_client(flags::SYN, options).build()
}

/// MSS WS NOP TS SAckOK: no Table 1 layout, so the option walk finds the timestamp.
fn syn_ts_after_wscale() -> Vec<u8> {
    syn([
        &[2u8, 4, 0x05, 0xb4, 3, 3, 7, 1][..],
        &ts_option(CLIENT_TS, 0),
        &[4, 2],
    ]
    .concat())
}

fn linux_syn() -> Vec<u8> {
    syn(options::linux_syn(CLIENT_TS, 0))
}

const IPV6_VIP: &str = "2001:db8::100";

/// The malformed-packet classes every mode detects before it looks at TCP options.
fn malformed_common() -> Vec<Input> {
    let good = linux_syn();
    let mut bad_ihl = good.clone();
    bad_ihl[14] = 0x44;
    testkit::refill_ipv4_checksum(&mut bad_ihl, 14);
    let mut bad_total = good.clone();
    bad_total[16..18].copy_from_slice(&((good.len() - 14 + 1) as u16).to_be_bytes());
    testkit::refill_ipv4_checksum(&mut bad_total, 14);
    // IPv4 total length covering only 10 bytes of TCP.
    let mut short_tcp = good[..14 + 20 + 10].to_vec();
    short_tcp[16..18].copy_from_slice(&30u16.to_be_bytes());
    testkit::refill_ipv4_checksum(&mut short_tcp, 14);
    let mut bad_offset = good.clone();
    bad_offset[14 + 20 + 12] = 0xf0;
    let mut bad_version = good.clone();
    bad_version[14] = 0x65;
    testkit::refill_ipv4_checksum(&mut bad_version, 14);
    // The SYN with 4 bytes of IP options (NOP NOP NOP EOL): IHL 6.
    let ip_options = testkit::with_ip_options(&good, &[1, 1, 1, 0]);
    let mut fragment = good.clone();
    fragment[20] = 0x20; // more fragments, offset 0
    testkit::refill_ipv4_checksum(&mut fragment, 14);
    let mut udp = good.clone();
    udp[23] = ip_proto::UDP;
    testkit::refill_ipv4_checksum(&mut udp, 14);
    let mut gre = good.clone();
    gre[23] = 47;
    testkit::refill_ipv4_checksum(&mut gre, 14);
    let mut other_port_ack = from_client(flags::ACK, Vec::new());
    other_port_ack.dst_port = 8443;
    let mut other_port = from_client(flags::SYN, options::linux_syn(CLIENT_TS, 0));
    other_port.dst_port = 8443;
    // A router's "fragmentation needed" about server 2's segment, edited: what the ICMP
    // path refuses before it looks for a cookie.
    let icmp_edited = |quote_len: usize, edit: &dyn Fn(&mut Vec<u8>)| {
        let mut frame = testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), quote_len);
        edit(&mut frame);
        testkit::refill_ipv4_checksum(&mut frame, 14);
        // The message runs to the frame's end; one shorter than its header has no checksum.
        if let Ok(mut icmp) = cheetah_core::wire::icmp::Icmpv4Packet::new_checked(&mut frame[34..])
        {
            icmp.fill_checksum();
        }
        frame
    };
    let icmp_inputs = [
        input(
            "icmp-echo-request",
            "A ping of the VIP address (ICMP echo request): no error the LB routes, dropped.",
            icmp_edited(28, &|f| {
                f[34] = 8;
                f[35] = 0;
            }),
        ),
        input(
            "icmp-truncated",
            "An ICMP message of 4 bytes to the VIP address: shorter than its header, dropped.",
            icmp_edited(28, &|f| {
                f.truncate(14 + 20 + 4);
                f[16..18].copy_from_slice(&24u16.to_be_bytes());
            }),
        ),
        input(
            "icmp-quote-truncated",
            "Fragmentation needed quoting 12 bytes of the IP header: too short a quote, dropped.",
            icmp_edited(12, &|_| {}),
        ),
        input(
            "icmp-quoting-udp",
            "Fragmentation needed quoting a UDP datagram from the VIP address: no TCP connection to route it to, dropped.",
            icmp_edited(28, &|f| f[42 + 9] = ip_proto::UDP),
        ),
        input(
            "icmp-quoting-another-source",
            "Fragmentation needed quoting a segment from another address than the VIP's: dropped.",
            icmp_edited(28, &|f| f[42 + 12] ^= 0x01),
        ),
        input(
            "icmp-quoting-unknown-port",
            "Fragmentation needed quoting a segment from the VIP address's port 8443, where no VIP is: dropped.",
            icmp_edited(28, &|f| f[62..64].copy_from_slice(&8443u16.to_be_bytes())),
        ),
        input(
            "icmp-bad-total-length",
            "Fragmentation needed whose IPv4 total length runs one byte past the frame: dropped.",
            icmp_edited(28, &|f| {
                let total = (f.len() - 14 + 1) as u16;
                f[16..18].copy_from_slice(&total.to_be_bytes());
            }),
        ),
    ];
    let mut inputs = vec![
        input(
            "truncated-ethernet",
            "10 bytes: shorter than an Ethernet header.",
            good[..10].to_vec(),
        ),
        input(
            "truncated-ipv4",
            "Ethernet header and 10 bytes of IPv4.",
            good[..24].to_vec(),
        ),
        input(
            "bad-ip-version",
            "Version 6 in a frame whose EtherType says IPv4.",
            bad_version,
        ),
        input(
            "bad-ipv4-header-length",
            "IHL 4 (16 bytes), below the minimum of 5.",
            bad_ihl,
        ),
        input(
            "syn-with-ip-options",
            "The Linux SYN with 4 bytes of IP options (NOP NOP NOP EOL, IHL 6): a well-formed segment, balanced with its options kept.",
            ip_options,
        ),
        input(
            "bad-ipv4-total-length",
            "IPv4 total length one byte past the end of the frame.",
            bad_total,
        ),
        input(
            "truncated-tcp",
            "IPv4 total length leaves only 10 bytes of TCP header.",
            short_tcp,
        ),
        input(
            "bad-tcp-data-offset",
            "TCP data offset 15 (60 bytes) runs past the segment.",
            bad_offset,
        ),
        input(
            "unsupported-fragment",
            "A first fragment (MF set) of a SYN to the VIP.",
            fragment,
        ),
        input(
            "unsupported-udp",
            "UDP to the VIP address (protocol byte of the SYN changed to 17).",
            udp,
        ),
        input(
            "vip-port-unknown",
            "A SYN to the VIP address on port 8443, where no VIP is configured.",
            other_port.build(),
        ),
        input(
            "vip-port-unknown-no-options",
            "An ACK without TCP options to the VIP address on port 8443.",
            other_port_ack.build(),
        ),
        input(
            "unsupported-protocol",
            "GRE to the VIP address (protocol byte of the SYN changed to 47).",
            gre,
        ),
        input(
            "arp",
            "An ARP request for the VIP: passed to the host.",
            testkit::arp_request(client()),
        ),
        input(
            "vlan-tagged-syn",
            "A Linux SYN with an 802.1Q tag (VLAN 42): balanced like an untagged one, tag kept.",
            testkit::vlan_tagged(&good),
        ),
    ];
    inputs.extend(icmp_inputs);
    inputs
}

/// Option-level malformations: only cheetah mode walks the options.
fn malformed_options() -> Vec<Input> {
    let with = |opts: Vec<u8>| from_client(flags::ACK, opts).build();
    vec![
        input(
            "tcp-option-truncated",
            "Options NOP NOP NOP MSS: the last kind has no length byte.",
            with(vec![1, 1, 1, 2]),
        ),
        input(
            "tcp-option-bad-length",
            "Options MSS with length 1.",
            with(vec![2, 1, 0, 0]),
        ),
        input(
            "tcp-option-overrun",
            "Options MSS with length 8 in a 4-byte option area.",
            with(vec![2, 8, 0, 0]),
        ),
        input(
            "bad-timestamp-option-length",
            "Options: a TS option with length 8 instead of 10 (fits the option area).",
            with(vec![8, 8, 0, 0, 0, 0, 0, 0]),
        ),
    ]
}

/// The same malformations in a TCP header with room for a timestamp (the straight line's
/// layout, not NOP NOP TS): a client's ACK and SYN, each dropped for the walk's reason.
fn malformed_long_options() -> Vec<Input> {
    let ack = |opts: Vec<u8>| from_client(flags::ACK, opts).build();
    vec![
        input(
            "established-option-truncated",
            "Client ACK with 11 NOPs then a kind without its length byte: tcp_option_truncated.",
            ack(vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]),
        ),
        input(
            "established-option-bad-length",
            "Client ACK with NOP NOP SACK of length 0: tcp_option_bad_length.",
            ack(vec![1, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ),
        input(
            "established-option-overrun",
            "Client ACK with NOP NOP SACK of length 30 in 12 option bytes: tcp_option_overrun.",
            ack(vec![1, 1, 5, 30, 0, 0, 0, 0, 0, 0, 0, 0]),
        ),
        input(
            "established-bad-timestamp-length",
            "Client ACK with NOP NOP and a TS option of length 8: bad_timestamp_option_length.",
            ack(vec![1, 1, 8, 8, 0, 0, 0, 1, 0, 0, 0, 2]),
        ),
        input(
            "syn-option-overrun",
            "SYN whose MSS option claims 40 bytes in 20: not a Table 1 layout, the walk finds an overrun.",
            syn(vec![2, 40, 5, 0xb4, 4, 2, 1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1]),
        ),
        input(
            "syn-bad-timestamp-length",
            "SYN with MSS then a TS option of length 12: bad_timestamp_option_length.",
            syn(vec![2, 4, 5, 0xb4, 8, 12, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]),
        ),
    ]
}

/// A timestamp option alone: kind, length, TSval, TSecr.
fn ts_option(tsval: u32, tsecr: u32) -> Vec<u8> {
    [&[8u8, 10][..], &tsval.to_be_bytes(), &tsecr.to_be_bytes()].concat()
}

/// Table 1's MSS NOP NOP TS SAckOK EOL (no testkit builder for it).
fn mss_nop_nop_ts(tsval: u32, tsecr: u32) -> Vec<u8> {
    let mut o = vec![2, 4, 0x05, 0xb4, 1, 1, 8, 10];
    o.extend_from_slice(&tsval.to_be_bytes());
    o.extend_from_slice(&tsecr.to_be_bytes());
    o.extend_from_slice(&[4, 2, 0, 0]);
    o
}

/// Cheetah mode: SYN layouts, cookies both ways, ICMP, FIN/RST, and the failure cases.
fn cheetah_inputs(nat: bool) -> Vec<Input> {
    let mut bad_sum = client_ack(cookie_ts(2, M, 0x5678));
    bad_sum[14 + 20 + 16] ^= 0x5a;
    let mut inputs = vec![
        input(
            "syn-linux",
            "Table 1 SYN: MSS SAckOK TS NOP WS. New connection, round-robin picks the first server.",
            linux_syn(),
        ),
        input(
            "syn-apple",
            "Table 1 SYN: MSS NOP WS NOP NOP TS SAckOK EOL (macOS/iOS).",
            syn(options::apple_syn(CLIENT_TS, 0)),
        ),
        input(
            "syn-mss-nop-ws-sackok-ts",
            "Table 1 SYN: MSS NOP WS SAckOK TS.",
            syn(options::mss_nop_ws_sackok_ts(CLIENT_TS, 0)),
        ),
        input(
            "syn-mss-nop-nop-ts",
            "Table 1 SYN: MSS NOP NOP TS SAckOK EOL.",
            syn(mss_nop_nop_ts(CLIENT_TS, 0)),
        ),
        input(
            "syn-ts-first",
            "SYN with TS first then NOPs: not a Table 1 layout, found by the option walk.",
            syn(options::ts_first(CLIENT_TS, 0)),
        ),
        input(
            "syn-no-timestamps",
            "Windows SYN without timestamps: fallback, the VIP's Maglev table picks the server.",
            syn(options::windows_syn()),
        ),
        input(
            "no-timestamps-ack-after-syn",
            "ACK without timestamps after the SYN on the same worker: the fallback table routes it.",
            from_client(flags::ACK, Vec::new()).build(),
        )
        .after(syn(options::windows_syn())),
        input(
            "established-cookie-current-period",
            "Client ACK echoing server 2's cookie of a TSval with MSB 0x1234 (epoch 4), M^ = 0x1234: TSecr restored to 0x12345678.",
            client_ack(cookie_ts(2, M, 0x5678)),
        )
        .msb(2, M),
        input(
            "established-cookie-previous-period",
            "Client ACK echoing server 2's cookie of a TSval with MSB 0x1233 (epoch 3), M^ = 0x1234: TSecr restored to 0x1233fff0.",
            client_ack(cookie_ts(2, M - 1, 0xfff0)),
        )
        .msb(2, M),
        input(
            "established-bad-tcp-checksum",
            "The current-period client ACK with its TCP checksum corrupted: forwarded, the checksum stays exactly as wrong.",
            bad_sum,
        )
        .msb(2, M),
        input(
            "client-fin",
            "Client FIN-ACK with server 2's cookie: routed by cookie like any packet.",
            from_client(
                flags::FIN | flags::ACK,
                options::nop_nop_ts(CLIENT_TS + 2, cookie_ts(2, M, 0x5678)),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "client-rst-without-timestamps",
            "Client RST without options: no cookie, unknown to the fallback table, Maglev picks.",
            from_client(flags::RST, Vec::new()).build(),
        ),
        input(
            "forged-cookie",
            "TSecr carrying a cookie for server 77, which does not exist.",
            client_ack(cookie_ts(77, M, 0x5678)),
        )
        .msb(2, M),
        input(
            "msb-unknown",
            "A valid cookie of server 2, but server 2's clock was never learnt nor imported.",
            client_ack(cookie_ts(2, M, 0x5678)),
        ),
        input(
            "server-syn-ack",
            "Server 2's Linux SYN-ACK: TSval's 16 MSB replaced by the cookie (epoch 0x1234 mod 16 = 4), its clock learnt.",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                options::linux_syn(SERVER_TS, CLIENT_TS),
            )
            .build(),
        ),
        input(
            "server-syn-ack-apple-layout",
            "Table 1 SYN-ACK: MSS NOP WS NOP NOP TS SAckOK EOL from server 2: cookie inserted.",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                options::apple_syn(SERVER_TS, CLIENT_TS),
            )
            .build(),
        ),
        input(
            "server-syn-ack-mss-nop-ws-sackok-ts",
            "Table 1 SYN-ACK: MSS NOP WS SAckOK TS from server 2: cookie inserted.",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                options::mss_nop_ws_sackok_ts(SERVER_TS, CLIENT_TS),
            )
            .build(),
        ),
        input(
            "server-syn-ack-mss-nop-nop-ts",
            "Table 1 SYN-ACK: MSS NOP NOP TS SAckOK EOL from server 2: cookie inserted.",
            from_server(nat, 2, flags::SYN | flags::ACK, mss_nop_nop_ts(SERVER_TS, CLIENT_TS))
                .build(),
        ),
        input(
            "server-data",
            "Server 2's data segment with NOP NOP TS: cookie inserted.",
            from_server(
                nat,
                2,
                flags::ACK | flags::PSH,
                options::nop_nop_ts(SERVER_TS + 1, CLIENT_TS + 1),
            )
            .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
            .build(),
        ),
        input(
            "server-syn-ack-odd-offset",
            "Server 2's SYN-ACK with MSS WS TS: TSval at an odd offset, checksum updated with swapped bytes.",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                options::odd_offset_ts(SERVER_TS + 2, CLIENT_TS),
            )
            .build(),
        ),
        input(
            "server-fin",
            "Server 2's FIN-ACK: cookie inserted, connection counted closed.",
            from_server(
                nat,
                2,
                flags::FIN | flags::ACK,
                options::nop_nop_ts(SERVER_TS + 3, CLIENT_TS + 2),
            )
            .build(),
        ),
        input(
            "server-rst",
            "Server 2's RST without options: nothing to put a cookie in.",
            from_server(nat, 2, flags::RST, Vec::new()).build(),
        ),
        input(
            "server-rst-ack-sack-without-timestamp",
            "Server 2's RST-ACK with NOP NOP SACK and no timestamp: to the client without a cookie, counted as a reset without timestamp, never as a close.",
            from_server(nat, 2, flags::RST | flags::ACK, nop_nop_sack()).build(),
        ),
        input(
            "server-ack-sack-without-timestamp",
            "Server 2's ACK with NOP NOP SACK and no timestamp: to the client without a cookie.",
            from_server(nat, 2, flags::ACK, nop_nop_sack()).build(),
        ),
        input(
            "server-data-without-options",
            "Server 2's data segment without options (a connection that negotiated no timestamps): to the client without a cookie.",
            from_server(nat, 2, flags::ACK | flags::PSH, Vec::new())
                .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
                .build(),
        ),
        input(
            "server-rst-timestamped",
            "Server 2's RST-ACK with NOP NOP TS (Linux aborting a connection that negotiated timestamps): cookie inserted, connection counted closed.",
            from_server(
                nat,
                2,
                flags::RST | flags::ACK,
                options::nop_nop_ts(SERVER_TS + 3, CLIENT_TS + 2),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "server-fin-retransmitted",
            "Server 2's FIN-ACK sent again, its data acknowledged meanwhile: the close is counted once, at the first.",
            TcpFrame {
                seq: SERVER_FIN_SEQ,
                ..from_server(
                    nat,
                    2,
                    flags::FIN | flags::ACK,
                    options::nop_nop_ts(SERVER_TS + 4, CLIENT_TS + 2),
                )
            }
            .build(),
        )
        .msb(2, M)
        .after(server_fin(nat)),
        input(
            "server-rst-after-fin",
            "Server 2's RST one past its FIN: the same close, not counted again.",
            TcpFrame {
                seq: SERVER_FIN_SEQ + 1,
                ..from_server(
                    nat,
                    2,
                    flags::RST | flags::ACK,
                    options::nop_nop_ts(SERVER_TS + 4, CLIENT_TS + 2),
                )
            }
            .build(),
        )
        .msb(2, M)
        .after(server_fin(nat)),
        // A connection without timestamps closes as one with them: its FIN counts once.
        input(
            "server-fin-without-timestamp",
            "Server 2's FIN-ACK with its last data and no options (a connection that negotiated no timestamps): to the client without a cookie, the connection counted closed.",
            server_fin_without_timestamp(nat),
        ),
        input(
            "server-fin-without-timestamp-retransmitted",
            "Server 2's FIN-ACK without options sent again, its data acknowledged meanwhile: the close is counted once, at the first.",
            TcpFrame {
                seq: SERVER_FIN_SEQ,
                ..from_server(nat, 2, flags::FIN | flags::ACK, Vec::new())
            }
            .build(),
        )
        .after(server_fin_without_timestamp(nat)),
        input(
            "server-fin-sack-without-timestamp",
            "Server 2's FIN-ACK with its last data and NOP NOP SACK, no timestamp (a header long enough for the straight line): no cookie, the connection counted closed.",
            from_server(nat, 2, flags::FIN | flags::ACK, nop_nop_sack())
                .with_payload(SERVER_FIN_DATA)
                .build(),
        ),
        input(
            "server-syn-without-ack",
            "Server 2's SYN without ACK (a simultaneous open's, answering no SYN) with the Linux layout: TSval's 16 MSB replaced by the cookie, its clock learnt; no handshake slot or fallback entry touched.",
            from_server(nat, 2, flags::SYN, options::linux_syn(SERVER_TS, 0)).build(),
        ),
        input(
            "server-syn-without-ack-mss-only",
            "Server 2's SYN without ACK with only MSS (no timestamp): to the client unchanged, the fallback table not taught (it answers no SYN).",
            from_server(nat, 2, flags::SYN, vec![2, 4, 0x05, 0xb4]).build(),
        ),
        input(
            "server-syn-ack-mss-only",
            "Server 2's SYN-ACK with only MSS (a 24-byte header, no room for a timestamp): to the client unchanged, the fallback table taught server 2.",
            from_server(nat, 2, flags::SYN | flags::ACK, vec![2, 4, 0x05, 0xb4]).build(),
        ),
        input(
            "server-syn-ack-mss-nop-ws",
            "Server 2's SYN-ACK with MSS NOP WScale (a 28-byte header, no timestamp): to the client unchanged, the fallback table taught server 2.",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                vec![2, 4, 0x05, 0xb4, 1, 3, 3, 7],
            )
            .build(),
        ),
        // Layouts no wide compare places: the option walk finds the timestamp (or finds
        // none) and the segment is handled exactly as at the usual place.
        input(
            "established-sack-before-ts",
            "Client ACK with NOP NOP SACK(1 block) NOP NOP TS: TSecr found by the option walk at option offset 14, restored, to server 2.",
            from_client(
                flags::ACK,
                [
                    &[1u8, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1][..],
                    &ts_option(CLIENT_TS + 1, cookie_ts(2, M, 0x5678)),
                ]
                .concat(),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "established-ts-odd-offset",
            "Client ACK with NOP TS NOP: TSecr at an odd offset, restored with the byte-swapped checksum update, to server 2.",
            from_client(
                flags::ACK,
                options::nop_ts_nop(CLIENT_TS + 1, cookie_ts(2, M - 1, 0xfff0)),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "established-ts-after-wscale",
            "Client ACK with WS NOP TS NOP NOP: TSecr found by the option walk, restored, to server 2.",
            from_client(
                flags::ACK,
                [
                    &[3u8, 3, 7, 1][..],
                    &ts_option(CLIENT_TS + 1, cookie_ts(2, M, 0x5678)),
                    &[1, 1],
                ]
                .concat(),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "established-eol-before-ts",
            "Client ACK whose options end (EOL) before a TS: no timestamp, unknown to the fallback table, Maglev picks.",
            from_client(
                flags::ACK,
                [&[0u8, 1][..], &ts_option(CLIENT_TS + 1, cookie_ts(2, M, 0x5678))].concat(),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "established-short-options",
            "Client ACK with a 24-byte TCP header (options NOP NOP NOP NOP): no timestamp, unknown to the fallback table, Maglev picks.",
            from_client(flags::ACK, vec![1, 1, 1, 1]).build(),
        ),
        input(
            "server-data-sack-before-ts",
            "Server 2's data segment with NOP NOP SACK(1 block) NOP NOP TS: cookie inserted where the option walk found TSval.",
            from_server(
                nat,
                2,
                flags::ACK | flags::PSH,
                [
                    &[1u8, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1][..],
                    &ts_option(SERVER_TS + 1, CLIENT_TS + 1),
                ]
                .concat(),
            )
            .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
            .build(),
        )
        .msb(2, M),
        input(
            "server-data-ts-odd-offset",
            "Server 2's data segment with NOP TS NOP: TSval at an odd offset, cookie inserted with the byte-swapped checksum update.",
            from_server(
                nat,
                2,
                flags::ACK | flags::PSH,
                options::nop_ts_nop(SERVER_TS + 1, CLIENT_TS + 1),
            )
            .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
            .build(),
        )
        .msb(2, M),
        input(
            "server-fin-ts-odd-offset",
            "Server 2's FIN-ACK with NOP TS NOP: cookie inserted at the odd offset, connection counted closed.",
            from_server(
                nat,
                2,
                flags::FIN | flags::ACK,
                options::nop_ts_nop(SERVER_TS + 3, CLIENT_TS + 2),
            )
            .build(),
        )
        .msb(2, M),
        input(
            "server-data-bad-timestamp-length",
            "Server 2's data segment with NOP NOP and a TS option of length 8: malformed, dropped.",
            from_server(
                nat,
                2,
                flags::ACK,
                vec![1, 1, 8, 8, 0, 0, 0, 1, 0, 0, 0, 2],
            )
            .build(),
        )
        .msb(2, M),
        input(
            "server-data-option-overrun",
            "Server 2's data segment with NOP NOP SACK of length 30 in 12 option bytes: malformed, dropped.",
            from_server(nat, 2, flags::ACK, vec![1, 1, 5, 30, 0, 0, 0, 0, 0, 0, 0, 0]).build(),
        )
        .msb(2, M),
        input(
            "server-short-header-option-overrun",
            "Server 2's ACK whose 4 option bytes claim a SACK of length 30: a header too short for the straight line, malformed, dropped by the general path (which counts nothing first).",
            from_server(nat, 2, flags::ACK, vec![1, 1, 5, 30]).build(),
        ),
        input(
            "client-syn-ack-cookie",
            "A client's SYN-ACK (Linux layout, as SYN-flood backscatter at a spoofed VIP address arrives) echoing server 2's cookie: routed by it on the general path, TSecr restored to 0x12345678.",
            client_syn_ack(cookie_ts(2, M, 0x5678)),
        )
        .msb(2, M),
        input(
            "client-syn-ack-forged-cookie",
            "A client's SYN-ACK whose TSecr carries a cookie for server 77, which does not exist: dropped.",
            client_syn_ack(cookie_ts(77, M, 0x5678)),
        )
        .msb(2, M),
        input(
            "client-rst-nop-nop-ts",
            "Client RST without ACK with NOP NOP TS: TSecr echoes nothing, so no cookie; found by the compare, then routed as a segment without timestamps (unknown to the fallback table, Maglev picks).",
            from_client(flags::RST, options::nop_nop_ts(CLIENT_TS, 0)).build(),
        ),
        input(
            "syn-ts-after-wscale",
            "SYN with MSS WS NOP TS SAckOK: not a Table 1 layout, found by the option walk; round-robin picks.",
            syn_ts_after_wscale(),
        ),
        input(
            "server-syn-ack-ts-after-sackok",
            "Server 2's SYN-ACK with MSS SAckOK NOP NOP TS: found by the option walk, cookie inserted.",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                [
                    &[2u8, 4, 0x05, 0xb4, 4, 2, 1, 1][..],
                    &ts_option(SERVER_TS, CLIENT_TS),
                    &[1, 1],
                ]
                .concat(),
            )
            .build(),
        ),
        input(
            "icmp-frag-needed-cookie",
            "ICMP fragmentation-needed quoting IP, TCP and options of a packet carrying server 2's cookie: routed to server 2, quoted TSval restored.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 20 + 32 + 8),
        )
        .msb(2, M),
        input(
            "icmp-frag-needed-forged-cookie",
            "ICMP fragmentation-needed quoting a segment whose cookie names server 77, which does not exist: dropped.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(77), 20 + 32 + 8),
        )
        .msb(2, M),
        input(
            "icmp-frag-needed-cookie-msb-unknown",
            "ICMP fragmentation-needed quoting a segment with server 2's cookie, whose clock the LB does not know: routed to server 2, the quote left as it came.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 20 + 32 + 8),
        ),
        input(
            "icmp-frag-needed-cookie-beyond-idle-limit",
            "ICMP fragmentation-needed quoting a segment with server 2's cookie of 9 periods before M^ = 0x1234 (more than 2^(4-1)): routed to server 2, the quoted TSval restored to 0x122b5678, and counted in echoes_beyond_idle_limit.",
            testkit::icmp_frag_needed(
                ROUTER,
                &seen_by_client_with(options::nop_nop_ts(
                    cookie_ts(2, M - 9, 0x5678),
                    CLIENT_TS + 1,
                )),
                20 + 32 + 8,
            ),
        )
        .msb(2, M),
        input(
            "icmp-frag-needed-cookie-sack-before-ts",
            "ICMP fragmentation-needed quoting a segment with NOP NOP SACK(1 block) NOP NOP TS carrying server 2's cookie: the option walk finds the quoted TSval; routed to server 2, TSval restored.",
            testkit::icmp_frag_needed(
                ROUTER,
                &seen_by_client_with(
                    [
                        &[1u8, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1][..],
                        &ts_option(cookie_ts(2, M, 0x5678), CLIENT_TS + 1),
                    ]
                    .concat(),
                ),
                20 + 44 + 8,
            ),
        )
        .msb(2, M),
        input(
            "icmp-frag-needed-cookie-ts-odd-offset",
            "ICMP fragmentation-needed quoting a segment with NOP TS NOP carrying server 2's cookie: the quoted TSval at an odd offset, restored with the byte-swapped checksum updates; routed to server 2.",
            testkit::icmp_frag_needed(
                ROUTER,
                &seen_by_client_with(options::nop_ts_nop(cookie_ts(2, M, 0x5678), CLIENT_TS + 1)),
                20 + 32 + 8,
            ),
        )
        .msb(2, M),
        input(
            "icmp-frag-needed-quote-malformed",
            "ICMP fragmentation-needed quoting a segment whose options overrun (NOP NOP SACK of length 30 in 12 bytes): no cookie for the core, which copies it to every active server.",
            testkit::icmp_frag_needed(
                ROUTER,
                &seen_by_client_with(vec![1, 1, 5, 30, 0, 0, 0, 0, 0, 0, 0, 0]),
                20 + 32 + 8,
            ),
        ),
        input(
            "icmp-frag-needed-8-bytes",
            "ICMP fragmentation-needed quoting only IP and 8 bytes of TCP: no cookie, copied to every active server.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 28),
        ),
        input(
            "icmp-frag-needed-no-timestamps-known-flow",
            "ICMP fragmentation-needed quoting a segment without options to a client without timestamps, after its Windows SYN: routed by the fallback table to the server the SYN went to, the quote unchanged.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client_with(Vec::new()), 20 + 20 + 8),
        )
        .after(syn(options::windows_syn())),
        input(
            "icmp-frag-needed-8-bytes-known-flow",
            "ICMP fragmentation-needed quoting only IP and 8 bytes of TCP of a connection the fallback table knows (its Windows SYN went first): routed to the server the table remembers.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 28),
        )
        .after(syn(options::windows_syn())),
    ];
    inputs.extend(malformed_common());
    inputs.extend(malformed_options());
    inputs.extend(malformed_long_options());
    inputs
}

/// What the epoch bits of `layout` promise, at the edges: an echo is restored to the newest
/// MSB `<= M^ + 1` with its epoch, exactly for echoes up to 2^k - 2 periods behind M^, and
/// counted when more than 2^(k-1) periods behind (past the idle gap PAWS allows). Server 2,
/// M^ = 0x1234 unless the name says otherwise.
fn epoch_inputs(layout: CookieLayout) -> Vec<Input> {
    let k = layout.epoch_bits();
    let epochs = layout.epochs();
    let half = epochs / 2;
    let echo = |msb: u16| client_ack(cookie_ts_in(layout, 2, msb, 0x5678));
    let mut inputs = vec![
        input(
            "server-data-msb-ffff",
            format!(
                "Server 2 sends TSval 0xffff5678, the last MSB before the wrap: the cookie's epoch is 0xffff mod 2^{k} = {}.",
                epochs - 1
            ),
            from_server(
                false,
                2,
                flags::ACK | flags::PSH,
                options::nop_nop_ts(0xffff_5678, CLIENT_TS + 1),
            )
            .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
            .build(),
        ),
        input(
            "echo-next-period",
            "Server 2's clock one period ahead of M^ = 0x1234 (its MSB moved before the LB saw it): the echo of MSB 0x1235 is restored to 0x1235, the top of the window.",
            echo(M + 1),
        )
        .msb(2, M),
    ];
    let mut back: std::collections::BTreeSet<u16> =
        [1, half, half + 1, epochs - 2, epochs - 1].into();
    if half > 4 {
        back.insert(half - 3);
    }
    for n in back {
        let sent = M - n;
        let periods = if n == 1 { "period" } else { "periods" };
        let description = if n == epochs - 1 {
            format!(
                "An echo {n} {periods} behind M^ = 0x1234 (MSB {sent:#06x}), past the restore window of 2^{k} - 2 = {} periods: its epoch is that of M^ + 1, so it is restored to 0x1235 (wrong, as the layout says; counted only when more than {half} periods back, which this restore is not).",
                epochs - 2
            )
        } else if n > half {
            format!(
                "An echo {n} {periods} behind M^ = 0x1234 (MSB {sent:#06x}): restored exactly, and counted in echoes_beyond_idle_limit (more than 2^({k}-1) = {half} periods back)."
            )
        } else {
            format!(
                "An echo {n} {periods} behind M^ = 0x1234 (MSB {sent:#06x}): restored exactly, not counted (at most 2^({k}-1) = {half} periods back)."
            )
        };
        inputs.push(input(format!("echo-{n}-periods-old"), description, echo(sent)).msb(2, M));
    }
    inputs.extend([
        input(
            "echo-wrap-ahead",
            "M^ = 0xffff and the server already at 0x0000: the echo of MSB 0x0000 is restored to 0x0000, across the wrap.",
            echo(0x0000),
        )
        .msb(2, 0xffff),
        input(
            "echo-wrap-behind",
            "M^ = 0x0001: the echo of MSB 0xffff, 2 periods back across the wrap (the oldest the window holds at k = 2), is restored to 0xffff.",
            echo(0xffff),
        )
        .msb(2, 0x0001),
        input(
            "echo-after-reply-advanced",
            "M^ = 0x1234, then (prelude) server 2 sends TSval 0x12365678, which moves M^ to 0x1236: the echo of that TSval is restored to 0x12365678.",
            echo(M + 2),
        )
        .msb(2, M)
        .after(
            from_server(
                false,
                2,
                flags::ACK,
                options::nop_nop_ts(0x1236_5678, CLIENT_TS + 1),
            )
            .build(),
        ),
    ]);
    inputs
}

/// A cheetah l2 suite with `k` epoch bits and its epoch vectors, plus cookies both ways.
fn layout_suite(name: &'static str, k: u8, extra_server: Option<u16>) -> Suite {
    let layout = CookieLayout::new(k).unwrap();
    let mut config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    config.cookie_epoch_bits = k;
    let mut inputs = vec![input(
        "server-data",
        format!(
            "Server 2's data segment, TSval 0x12345678: cookie with epoch 0x1234 mod 2^{k} = {}.",
            M & (layout.epochs() - 1)
        ),
        from_server(
            false,
            2,
            flags::ACK | flags::PSH,
            options::nop_nop_ts(SERVER_TS, CLIENT_TS + 1),
        )
        .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
        .build(),
    )];
    if let Some(id) = extra_server {
        let mut server = config.servers[0].clone();
        server.id = id;
        server.dip = std::net::Ipv4Addr::from(testkit::server_dip(id)).into();
        server.mac = Some(cheetah_core::types::format_mac(&testkit::server_mac(id)));
        config.servers.push(server);
        config.vips[0].servers.push(id);
        inputs.push(input(
            format!("server-data-id-{id}"),
            format!(
                "Server {id}'s data segment: an id above 4095 needs the {} id bits of this layout.",
                layout.id_bits()
            ),
            from_server(
                false,
                id,
                flags::ACK | flags::PSH,
                options::nop_nop_ts(SERVER_TS, CLIENT_TS + 1),
            )
            .build(),
        ));
        inputs.push(
            input(
                format!("echo-id-{id}"),
                format!("The echo of server {id}'s cookie (MSB 0x1234): routed to server {id}, TSecr restored."),
                client_ack(cookie_ts_in(layout, id, M, 0x5678)),
            )
            .msb(id, M),
        );
    }
    inputs.extend(epoch_inputs(layout));
    Suite {
        name,
        config,
        removed_servers: Vec::new(),
        inputs,
    }
}

/// Server 2's segment carrying a response, its timestamps where Linux puts them.
fn server_data(nat: bool) -> Vec<u8> {
    from_server(
        nat,
        2,
        flags::ACK | flags::PSH,
        options::nop_nop_ts(SERVER_TS + 1, CLIENT_TS + 1),
    )
    .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
    .build()
}

/// l2: what a VIP address sends that is no TCP segment: a server's ICMP error to its client
/// (port unreachable, quoting the client's UDP datagram) goes to the client as it came; the
/// same from a MAC no server has, or as a fragment, is dropped.
fn not_tcp_from_vip() -> Vec<Input> {
    let data = server_data(false);
    let (vip, client) = (&data[26..30], &data[30..34]);
    // The client's UDP datagram to the VIP of 12 bytes of data, quoted to 8 of UDP.
    let mut quoted = vec![0u8; 40];
    cheetah_core::wire::ipv4::write_header(
        &mut quoted,
        u32::from_be_bytes(client.try_into().unwrap()),
        u32::from_be_bytes(vip.try_into().unwrap()),
        ip_proto::UDP,
        40,
        64,
    );
    quoted.truncate(28);
    quoted[20..28].copy_from_slice(&[0xc3, 0x50, 0x00, 0x35, 0x00, 0x14, 0x00, 0x00]);
    let mut unreachable = data[..34].to_vec();
    unreachable.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    unreachable.extend_from_slice(&quoted);
    let total = (unreachable.len() - 14) as u16;
    unreachable[16..18].copy_from_slice(&total.to_be_bytes());
    unreachable[23] = ip_proto::ICMP;
    testkit::refill_ipv4_checksum(&mut unreachable, 14);
    cheetah_core::wire::icmp::Icmpv4Packet::new_checked(&mut unreachable[34..])
        .unwrap()
        .fill_checksum();
    let mut forged = unreachable.clone();
    forged[6..12].copy_from_slice(&[0x02, 0, 0, 0x09, 0, 0x09]);
    let mut fragment = unreachable.clone();
    fragment[20] = 0x20; // more fragments, offset 0
    testkit::refill_ipv4_checksum(&mut fragment, 14);
    vec![
        input(
            "server-icmp-port-unreachable",
            "Server 2's ICMP port unreachable from the VIP address to the client: forwarded as it came.",
            unreachable,
        ),
        input(
            "forged-not-tcp-from-vip",
            "The same ICMP error from a MAC no server has: dropped as from an unknown source.",
            forged,
        ),
        input(
            "server-not-tcp-fragment",
            "The same ICMP error as a first fragment (MF set): dropped.",
            fragment,
        ),
    ]
}

/// Server 2's segments whose layout the straight line refuses (l2: from a VIP address;
/// nat: from its backend address and port), under the first reason the core finds (l2:
/// the sender's MAC, the fragment; then the TCP header).
fn garbled_replies(nat: bool) -> Vec<Input> {
    let data = server_data(nat);
    let mut bad_offset = data.clone();
    bad_offset[14 + 20 + 12] = 0xf0;
    // Total length leaving 10 bytes of TCP: the ports, not the header.
    let mut truncated = data[..14 + 20 + 10].to_vec();
    truncated[16..18].copy_from_slice(&30u16.to_be_bytes());
    testkit::refill_ipv4_checksum(&mut truncated, 14);
    let mut fragment = data.clone();
    fragment[20] = 0x20; // more fragments, offset 0
    testkit::refill_ipv4_checksum(&mut fragment, 14);
    let mut inputs = vec![
        input(
            "server-data-bad-tcp-data-offset",
            "Server 2's data segment with TCP data offset 15 (60 bytes), past its end: dropped.",
            bad_offset.clone(),
        ),
        input(
            "server-truncated-tcp",
            "Server 2's segment whose IPv4 total length leaves 10 bytes of TCP header: dropped.",
            truncated,
        ),
    ];
    if nat {
        inputs.push(input(
            "backend-fragment-passes",
            "A first fragment (MF set) of server 2's data segment from its backend address: no reply the LB takes, passed.",
            fragment,
        ));
    } else {
        let mut forged = bad_offset;
        forged[6..12].copy_from_slice(&[0x02, 0, 0, 0x09, 0, 0x09]);
        inputs.extend([
            input(
                "forged-server-garbled-tcp",
                "A garbled segment from the VIP address and port whose source MAC is no server's: dropped as from an unknown source.",
                forged,
            ),
            input(
                "server-fragment",
                "A first fragment (MF set) of server 2's data segment: dropped.",
                fragment,
            ),
        ]);
    }
    inputs
}

/// A trunk port's traffic in cheetah mode: behind one VLAN tag or two, the same verdicts
/// and bytes as untagged, tags kept.
fn tagged_cheetah_inputs(nat: bool) -> Vec<Input> {
    let established = client_ack(cookie_ts(2, M, 0x5678));
    let server_data = server_data(nat);
    let syn_ack = from_server(
        nat,
        2,
        flags::SYN | flags::ACK,
        options::linux_syn(SERVER_TS, CLIENT_TS),
    )
    .build();
    let mut three_tags = testkit::qinq_tagged(&testkit::vlan_tagged(&linux_syn()));
    three_tags[12..14].copy_from_slice(&[0x81, 0x00]);
    vec![
        input(
            "vlan-tagged-established",
            "Client ACK behind an 802.1Q tag echoing server 2's cookie: TSecr restored, tag kept.",
            testkit::vlan_tagged(&established),
        )
        .msb(2, M),
        input(
            "qinq-tagged-established",
            "The same ACK behind 802.1ad and 802.1Q tags: both tags kept.",
            testkit::qinq_tagged(&established),
        )
        .msb(2, M),
        input(
            "vlan-tagged-server-data",
            "Server 2's data segment behind an 802.1Q tag: cookie inserted, tag kept.",
            testkit::vlan_tagged(&server_data),
        ),
        input(
            "qinq-tagged-server-syn-ack",
            "Server 2's SYN-ACK behind 802.1ad and 802.1Q tags: cookie inserted, tags kept.",
            testkit::qinq_tagged(&syn_ack),
        ),
        input(
            "qinq-tagged-syn",
            "A Linux SYN behind 802.1ad and 802.1Q tags: balanced, tags kept.",
            testkit::qinq_tagged(&linux_syn()),
        ),
        input(
            "three-tags",
            "A SYN behind three tags: more than the LB reads past, passed to the host.",
            three_tags,
        ),
    ]
}

/// Segments with IP options (rare on the Internet, but well-formed): the same verdicts and
/// TCP bytes as without them, options kept where they were.
fn ip_options_cheetah_inputs(nat: bool) -> Vec<Input> {
    // Router Alert: the option a router may actually set.
    let router_alert = [0x94, 0x04, 0x00, 0x00];
    // 40 bytes, the most an IPv4 header holds: Router Alert, NOPs, EOL.
    let mut longest = router_alert.to_vec();
    longest.resize(40, 1);
    longest[39] = 0;
    let established = client_ack(cookie_ts(2, M, 0x5678));
    let server_data = server_data(nat);
    let server_fin = server_fin(nat);
    vec![
        input(
            "established-with-ip-options",
            "Client ACK with a Router Alert IP option echoing server 2's cookie: TSecr restored, option kept.",
            testkit::with_ip_options(&established, &router_alert),
        )
        .msb(2, M),
        input(
            "vlan-tagged-established-with-ip-options",
            "The same ACK behind an 802.1Q tag: tag and option kept.",
            testkit::vlan_tagged(&testkit::with_ip_options(&established, &router_alert)),
        )
        .msb(2, M),
        input(
            "server-data-with-ip-options",
            "Server 2's data segment with 40 bytes of IP options (the most there are): cookie inserted, options kept.",
            testkit::with_ip_options(&server_data, &longest),
        ),
        input(
            "server-fin-with-ip-options",
            "Server 2's FIN with a Router Alert IP option: a close counted, cookie inserted, option kept.",
            testkit::with_ip_options(&server_fin, &router_alert),
        ),
        input(
            "icmp-frag-needed-cookie-with-ip-options",
            "ICMP fragmentation-needed quoting server 2's cookie, its own IP header with a Router Alert option: routed to server 2, quoted TSval restored, option kept.",
            testkit::with_ip_options(
                &testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 20 + 32 + 8),
                &router_alert,
            ),
        )
        .msb(2, M),
        input(
            "icmp-frag-needed-cookie-quoting-ip-options",
            "ICMP fragmentation-needed quoting server 2's segment sent with a Router Alert IP option (quoted IHL 6): the quoted TCP header found past the option, routed to server 2, quoted TSval restored.",
            testkit::icmp_frag_needed(
                ROUTER,
                &testkit::with_ip_options(&seen_by_client(2), &router_alert),
                24 + 32 + 8,
            ),
        )
        .msb(2, M),
    ]
}

/// Hash and Maglev modes: every packet of a connection goes where the hash says.
/// The baselines' inputs, with l2 or NAT forwarding (`nat`: the servers' segments come
/// from their backend address and port, and go out from the VIP's).
fn baseline_inputs(nat: bool) -> Vec<Input> {
    let mut bad_sum = client_ack(CLIENT_TS);
    bad_sum[14 + 20 + 16] ^= 0x5a;
    let mut inputs = vec![
        input("syn-linux", "A Linux SYN: the hash picks the server.", linux_syn()),
        input(
            "established-ack",
            "A client ACK of the same connection: same server, TSecr untouched (no cookie).",
            client_ack(0x2222_3333),
        ),
        input(
            "established-bad-tcp-checksum",
            "The ACK with a corrupted TCP checksum: forwarded, checksum unchanged.",
            bad_sum,
        ),
        input(
            "server-syn-ack",
            "Server 2's SYN-ACK: to the client unchanged (no cookie in this mode).",
            from_server(
                nat,
                2,
                flags::SYN | flags::ACK,
                options::linux_syn(SERVER_TS, CLIENT_TS),
            )
            .build(),
        ),
        input(
            "icmp-frag-needed",
            "ICMP fragmentation-needed about the connection: routed by the hash of the quoted ports.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 28),
        ),
        input(
            "icmp-frag-needed-whole-quote",
            "ICMP fragmentation-needed quoting the whole TCP header: routed by the hash of the quoted ports (with NAT, the quoted TCP checksum follows the translation).",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 20 + 32 + 8),
        ),
        input(
            "server-rst",
            "Server 2's RST without options: to the client unchanged (this mode counts no close).",
            from_server(nat, 2, flags::RST, Vec::new()).build(),
        ),
        input(
            "server-data-without-options",
            "Server 2's data segment without options: to the client unchanged.",
            from_server(nat, 2, flags::ACK | flags::PSH, Vec::new())
                .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
                .build(),
        ),
        input(
            "options-not-parsed",
            "An ACK with malformed options: this mode never walks options, so it is forwarded.",
            from_client(flags::ACK, vec![2, 1, 0, 0]).build(),
        ),
    ];
    if !nat {
        inputs.extend(not_tcp_from_vip());
        inputs.push(input(
            "unknown-server-source",
            "A packet from the VIP address whose source MAC is no server's.",
            TcpFrame {
                src_mac: [0x02, 0, 0, 0x09, 0, 0x09],
                ..from_server(false, 2, flags::ACK, Vec::new())
            }
            .build(),
        ));
    }
    // More connections, so that a pick by the wrong hash shows (each a pick of 1 in n).
    inputs.extend((1..=3).map(|n| {
        let port = CLIENT_PORT + n;
        let quoted = TcpFrame {
            dst_port: port,
            ..TcpFrame::from_server_l2(
                2,
                client(),
                port,
                flags::ACK,
                options::nop_nop_ts(SERVER_TS, CLIENT_TS),
            )
        }
        .build();
        input(
            format!("icmp-frag-needed-port-{port}"),
            "ICMP fragmentation-needed about another connection of the client: routed by the hash of its ports.",
            testkit::icmp_frag_needed(ROUTER, &quoted, 28),
        )
    }));
    inputs.extend(garbled_replies(nat));
    inputs.extend([
        input(
            "vlan-tagged-established-ack",
            "The client ACK behind an 802.1Q tag: the hash's server, tag kept.",
            testkit::vlan_tagged(&client_ack(0x2222_3333)),
        ),
        input(
            "icmp-frag-needed-with-ip-options",
            "ICMP fragmentation-needed about the connection, its own IP header with a Router Alert option: routed by the hash of the quoted ports, option kept.",
            testkit::with_ip_options(
                &testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 28),
                &[0x94, 0x04, 0x00, 0x00],
            ),
        ),
        input(
            "icmp-frag-needed-quoting-ip-options",
            "ICMP fragmentation-needed quoting the connection's segment sent with a Router Alert IP option (quoted IHL 6, then 8 bytes of TCP): routed by the hash of the quoted ports, found past the option.",
            testkit::icmp_frag_needed(
                ROUTER,
                &testkit::with_ip_options(&seen_by_client(2), &[0x94, 0x04, 0x00, 0x00]),
                24 + 8,
            ),
        ),
        input(
            "established-ack-with-ip-options",
            "The client ACK with a Router Alert IP option: the hash's server, option kept.",
            testkit::with_ip_options(&client_ack(0x2222_3333), &[0x94, 0x04, 0x00, 0x00]),
        ),
        input(
            "server-fin-with-ip-options",
            "Server 2's FIN with a Router Alert IP option: to the client, option kept.",
            testkit::with_ip_options(&server_fin(nat), &[0x94, 0x04, 0x00, 0x00]),
        ),
        input(
            "qinq-tagged-server-syn-ack",
            "Server 2's SYN-ACK behind 802.1ad and 802.1Q tags: to the client, tags kept.",
            testkit::qinq_tagged(
                &from_server(
                    nat,
                    2,
                    flags::SYN | flags::ACK,
                    options::linux_syn(SERVER_TS, CLIENT_TS),
                )
                .build(),
            ),
        ),
    ]);
    inputs.extend(malformed_common());
    inputs
}

/// A baseline mode with NAT forwarding: the VIP's backends listen on `BACKEND_PORT`.
fn nat_baseline_config(mode: Mode, policy: PolicyKind) -> LbConfig {
    let mut config = testkit::config(mode, Forwarding::Nat, policy, 3);
    config.vips[0].backend_port = Some(BACKEND_PORT);
    config
}

fn with_ipv6_vip(mut config: LbConfig) -> LbConfig {
    config.vips.push(VipConfig {
        address: IPV6_VIP.parse().unwrap(),
        port: 80,
        policy: PolicyKind::RoundRobin,
        load_metric: None,
        backend_port: None,
        servers: vec![1, 2, 3],
        weights: Default::default(),
        health: Default::default(),
    });
    config
}

fn suites() -> Vec<Suite> {
    let mut l2 = cheetah_inputs(false);
    l2.extend(epoch_inputs(CookieLayout::DEFAULT));
    l2.extend(tagged_cheetah_inputs(false));
    l2.extend(ip_options_cheetah_inputs(false));
    l2.push(input(
        "unsupported-ipv6",
        "An IPv6 SYN to the suite's IPv6 VIP 2001:db8::100.",
        testkit::ipv6_syn(CLIENT_PORT, IPV6_VIP.parse().unwrap()),
    ));
    l2.extend(garbled_replies(false));
    l2.extend(not_tcp_from_vip());
    l2.push(input(
        "unknown-server-source",
        "A packet from the VIP address whose source MAC is no server's.",
        TcpFrame {
            src_mac: [0x02, 0, 0, 0x09, 0, 0x09],
            ..from_server(false, 2, flags::ACK, options::nop_nop_ts(SERVER_TS, 0))
        }
        .build(),
    ));
    let mut nat = cheetah_inputs(true);
    nat.extend(tagged_cheetah_inputs(true));
    nat.extend(ip_options_cheetah_inputs(true));
    nat.extend(garbled_replies(true));
    nat.push(input(
        "unknown-source-passes",
        "In NAT mode a reply from an address:port that is no backend is not ours: passed.",
        TcpFrame {
            src_ip: 0x0a01_0063,
            ..from_server(true, 2, flags::ACK, options::nop_nop_ts(SERVER_TS, 0))
        }
        .build(),
    ));
    let mut nat_config = testkit::config(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 3);
    nat_config.vips[0].backend_port = Some(BACKEND_PORT);
    let nat_removed_config = nat_config.clone();
    vec![
        Suite {
            name: "l2-cheetah",
            config: with_ipv6_vip(testkit::config(
                Mode::Cheetah,
                Forwarding::L2,
                PolicyKind::RoundRobin,
                3,
            )),
            removed_servers: Vec::new(),
            inputs: l2,
        },
        Suite {
            name: "nat-cheetah",
            config: nat_config,
            removed_servers: Vec::new(),
            inputs: nat,
        },
        Suite {
            name: "l2-hash",
            config: testkit::config(Mode::Hash, Forwarding::L2, PolicyKind::Hash, 3),
            removed_servers: Vec::new(),
            inputs: baseline_inputs(false),
        },
        Suite {
            name: "l2-maglev",
            config: testkit::config(Mode::Maglev, Forwarding::L2, PolicyKind::Maglev, 3),
            removed_servers: Vec::new(),
            inputs: baseline_inputs(false),
        },
        Suite {
            name: "nat-hash",
            config: nat_baseline_config(Mode::Hash, PolicyKind::Hash),
            removed_servers: Vec::new(),
            inputs: baseline_inputs(true),
        },
        Suite {
            name: "nat-maglev",
            config: nat_baseline_config(Mode::Maglev, PolicyKind::Maglev),
            removed_servers: Vec::new(),
            inputs: baseline_inputs(true),
        },
        Suite {
            name: "l2-cheetah-removed",
            config: testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3),
            removed_servers: vec![3],
            inputs: vec![
                input(
                    "cookie-server-removed",
                    "A client ACK echoing the cookie of server 3, which was removed.",
                    client_ack(cookie_ts(3, M, 0x5678)),
                )
                .msb(3, M),
                input(
                    "icmp-frag-needed-cookie-server-removed",
                    "ICMP fragmentation-needed quoting a segment with the cookie of server 3, which was removed: dropped.",
                    testkit::icmp_frag_needed(ROUTER, &seen_by_client(3), 20 + 32 + 8),
                )
                .msb(3, M),
                input(
                    "server-removed",
                    "A reply from removed server 3 (known by its MAC).",
                    from_server(false, 3, flags::ACK, options::nop_nop_ts(SERVER_TS, 0)).build(),
                ),
                input(
                    "server-removed-rst",
                    "An RST without options from removed server 3: the general path's drop.",
                    from_server(false, 3, flags::RST, Vec::new()).build(),
                ),
                input(
                    "server-removed-garbled-tcp",
                    "A segment from removed server 3 with TCP data offset 15: dropped as a removed server's, before its header is read.",
                    {
                        let mut f = from_server(false, 3, flags::ACK, options::nop_nop_ts(SERVER_TS, 0)).build();
                        f[14 + 20 + 12] = 0xf0;
                        f
                    },
                ),
                input(
                    "syn-skips-removed-server",
                    "A new connection: round-robin over the servers left (1 and 2).",
                    linux_syn(),
                ),
            ],
        },
        Suite {
            name: "nat-cheetah-removed",
            config: nat_removed_config,
            removed_servers: vec![3],
            inputs: vec![
                input(
                    "server-removed",
                    "A late reply from removed server 3 (its DIP and the backend port): dropped.",
                    from_server(true, 3, flags::ACK, options::nop_nop_ts(SERVER_TS, 0)).build(),
                ),
                input(
                    "server-removed-rst",
                    "An RST without options from removed server 3: dropped.",
                    from_server(true, 3, flags::RST, Vec::new()).build(),
                ),
                input(
                    "server-removed-garbled-tcp",
                    "A segment from removed server 3 with TCP data offset 15: dropped as a removed server's, before its header is read.",
                    {
                        let mut f = from_server(true, 3, flags::ACK, options::nop_nop_ts(SERVER_TS, 0)).build();
                        f[14 + 20 + 12] = 0xf0;
                        f
                    },
                ),
                input(
                    "server-removed-fragment",
                    "A first fragment (MF set) of a segment from removed server 3: dropped as a removed server's.",
                    {
                        let mut f = from_server(true, 3, flags::ACK, options::nop_nop_ts(SERVER_TS, 0)).build();
                        f[20] = 0x20;
                        testkit::refill_ipv4_checksum(&mut f, 14);
                        f
                    },
                ),
                input(
                    "reply-of-a-current-server",
                    "A reply from server 2, beside the removed one: forwarded.",
                    from_server(true, 2, flags::ACK, options::nop_nop_ts(SERVER_TS, 0)).build(),
                ),
            ],
        },
        layout_suite("l2-cheetah-k2", 2, Some(9000)),
        layout_suite("l2-cheetah-k6", 6, None),
        Suite {
            name: "l2-cheetah-empty-pool",
            config: with_every_server_draining(testkit::config(
                Mode::Cheetah,
                Forwarding::L2,
                PolicyKind::RoundRobin,
                3,
            )),
            removed_servers: Vec::new(),
            inputs: empty_pool_cheetah_inputs(),
        },
        Suite {
            name: "l2-hash-empty-pool",
            config: with_every_server_draining(testkit::config(
                Mode::Hash,
                Forwarding::L2,
                PolicyKind::Hash,
                3,
            )),
            removed_servers: Vec::new(),
            inputs: empty_pool_baseline_inputs(),
        },
        Suite {
            name: "l2-maglev-empty-pool",
            config: with_every_server_draining(testkit::config(
                Mode::Maglev,
                Forwarding::L2,
                PolicyKind::Maglev,
                3,
            )),
            removed_servers: Vec::new(),
            inputs: empty_pool_baseline_inputs(),
        },
    ]
}

/// A VIP whose every server is draining: its pool is empty (the maintenance an operator
/// does before taking a whole VIP down), and its servers still serve their connections.
fn with_every_server_draining(mut config: LbConfig) -> LbConfig {
    for server in &mut config.servers {
        server.state = ConfiguredState::Draining;
    }
    config
}

/// New connections to an empty pool are dropped (`no_server_available`) on every path
/// that would pick a server; a connection a draining server holds carries on.
fn empty_pool_cheetah_inputs() -> Vec<Input> {
    vec![
        input(
            "empty-pool-syn",
            "A Linux SYN to a VIP whose every server is draining: nobody to take it, dropped.",
            linux_syn(),
        ),
        input(
            "empty-pool-syn-walked",
            "A SYN whose timestamp the option walk finds (MSS WS NOP TS SAckOK), to the empty pool: dropped.",
            syn_ts_after_wscale(),
        ),
        input(
            "empty-pool-syn-without-timestamp",
            "A Windows SYN (no timestamp) to the empty pool: no Maglev table to place it, dropped.",
            syn(options::windows_syn()),
        ),
        input(
            "empty-pool-syn-without-options",
            "A SYN without options to the empty pool: dropped.",
            syn(Vec::new()),
        ),
        input(
            "empty-pool-fallback-miss",
            "An ACK without options the fallback table does not know, to the empty pool: dropped.",
            from_client(flags::ACK, Vec::new()).build(),
        ),
        input(
            "empty-pool-icmp-without-cookie",
            "ICMP fragmentation-needed quoting a segment without options of a flow the fallback table does not know: no server to copy it to, dropped.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client_with(Vec::new()), 20 + 20 + 8),
        ),
        input(
            "empty-pool-icmp-cookie-of-draining-server",
            "ICMP fragmentation-needed quoting server 2's cookie: its connection is still served, routed to it, TSval restored.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 20 + 32 + 8),
        )
        .msb(2, M),
        input(
            "empty-pool-reply-of-draining-server",
            "Server 2's data segment: a draining server's replies still get its cookie.",
            server_data(false),
        ),
        input(
            "empty-pool-cookie-of-draining-server",
            "A client ACK echoing the cookie of server 2, which is draining: its connection carries on, TSecr restored.",
            client_ack(cookie_ts(2, M, 0x5678)),
        )
        .msb(2, M),
    ]
}

/// The baselines' picks for an empty pool: on the straight line and on the general path.
fn empty_pool_baseline_inputs() -> Vec<Input> {
    vec![
        input(
            "empty-pool-pick",
            "A client ACK to a VIP whose every server is draining: the baseline has no server to pick, dropped.",
            client_ack(0x2222_3333),
        ),
        input(
            "empty-pool-icmp",
            "ICMP fragmentation-needed about a connection to the empty pool: no server to pick, dropped.",
            testkit::icmp_frag_needed(ROUTER, &seen_by_client(2), 28),
        ),
        input(
            "empty-pool-pick-general",
            "A client ACK with four bytes of NOPs (the general path's layout) to the empty pool: dropped.",
            from_client(flags::ACK, vec![1, 1, 1, 1]).build(),
        ),
    ]
}

fn verdict_name(verdict: Verdict) -> String {
    match verdict {
        Verdict::ToServer(server) => format!("to_server:{}", server.0),
        Verdict::ToClient => "to_client".into(),
        Verdict::ToAllServers { vip } => format!("to_all_servers:{vip}"),
        Verdict::Pass => "pass".into(),
        Verdict::Drop(reason) => format!("drop:{}", reason.name()),
    }
}

/// Runs one vector's input through a fresh pipeline, as the files describe it.
fn run(config: &LbConfig, secret: &Secret, removed: &[u16], input: &Vector) -> Vector {
    let mut plane = ControlPlane::new(config, secret).expect("suite config is valid");
    for id in removed {
        plane.remove_server(*id, 0).expect("removable server");
    }
    let msb: Vec<_> = input
        .msb_state
        .iter()
        .map(|e| (ServerId(e.server), u32::from(e.msb) << 16))
        .collect();
    plane.shared().msb.import(&msb, 0);
    let mut worker = Worker::new(Arc::clone(plane.shared()), WorkerConfig::new(0, 1, config));
    let prelude = input
        .prelude
        .iter()
        .map(|p| {
            let mut packet = hex::decode(&p.packet_in).unwrap();
            PreludePacket {
                verdict: verdict_name(worker.process(&mut packet, p.now_ns, Ingress::ServerSide)),
                ..p.clone()
            }
        })
        .collect();
    let mut packet = hex::decode(&input.packet_in).unwrap();
    let original = packet.clone();
    let verdict = worker.process(&mut packet, input.now_ns, Ingress::ServerSide);
    let copies = match verdict {
        Verdict::ToAllServers { vip } => worker
            .copy_targets(vip)
            .to_vec()
            .into_iter()
            .map(|server| {
                let mut copy = original.clone();
                worker.prepare_copy(&mut copy, vip, server);
                CopyOut {
                    server: server.0,
                    packet_out: hex::encode(copy),
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    Vector {
        prelude,
        verdict: verdict_name(verdict),
        packet_out: hex::encode(packet),
        copies,
        echoes_beyond_idle_limit: plane.shared().msb.echoes_beyond_idle_limit(),
        ..input.clone()
    }
}

/// The vector file a suite's code definitions describe, outputs left empty.
fn defined(suite: &Suite) -> VectorFile {
    VectorFile {
        removed_servers: suite.removed_servers.clone(),
        vector: suite
            .inputs
            .iter()
            .map(|i| Vector {
                name: i.name.clone(),
                description: i.description.clone(),
                now_ns: NOW,
                msb_state: i
                    .msb
                    .iter()
                    .map(|&(server, msb)| MsbEntry { server, msb })
                    .collect(),
                prelude: i
                    .prelude
                    .iter()
                    .enumerate()
                    .map(|(n, p)| PreludePacket {
                        now_ns: NOW - (i.prelude.len() - n) as u64 * PRELUDE_STEP,
                        packet_in: hex::encode(p),
                        verdict: String::new(),
                    })
                    .collect(),
                packet_in: hex::encode(&i.packet),
                verdict: String::new(),
                packet_out: String::new(),
                copies: Vec::new(),
                echoes_beyond_idle_limit: 0,
            })
            .collect(),
    }
}

/// The inputs of a vector file, outputs blanked, to compare with the definitions.
fn inputs_only(file: &VectorFile) -> VectorFile {
    VectorFile {
        removed_servers: file.removed_servers.clone(),
        vector: file
            .vector
            .iter()
            .map(|v| Vector {
                prelude: v
                    .prelude
                    .iter()
                    .map(|p| PreludePacket {
                        verdict: String::new(),
                        ..p.clone()
                    })
                    .collect(),
                verdict: String::new(),
                packet_out: String::new(),
                copies: Vec::new(),
                echoes_beyond_idle_limit: 0,
                ..v.clone()
            })
            .collect(),
    }
}

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with CHEETAH_REGEN_VECTORS=1 (docs/test-vectors.md)",
            path.display()
        )
    })
}

const HEADER: &str = "# Generated by crates/core/tests/vectors.rs (CHEETAH_REGEN_VECTORS=1); \
see docs/test-vectors.md.\n# packet_in/packet_out are whole Ethernet frames in hex; \
packet_out is the buffer after Worker::process.\n\n";

fn regenerate(suite: &Suite, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config_text = toml::to_string_pretty(&suite.config).unwrap();
    // What is written must read back as the same config.
    assert_eq!(LbConfig::from_toml(&config_text).unwrap(), suite.config);
    // A config file that already reads as the suite's is kept as written (serializing
    // would spell out every default field, a diff that says nothing).
    let config_path = dir.join("config.toml");
    let kept = std::fs::read_to_string(&config_path)
        .ok()
        .and_then(|text| LbConfig::from_toml(&text).ok())
        .is_some_and(|config| config == suite.config);
    if !kept {
        std::fs::write(&config_path, config_text).unwrap();
    }
    std::fs::write(dir.join("secret.hex"), format!("{}\n", SECRET.to_hex())).unwrap();
    let defined = defined(suite);
    let file = VectorFile {
        removed_servers: defined.removed_servers.clone(),
        vector: defined
            .vector
            .iter()
            .map(|v| run(&suite.config, &SECRET, &suite.removed_servers, v))
            .collect(),
    };
    let text = format!("{HEADER}{}", toml::to_string_pretty(&file).unwrap());
    std::fs::write(dir.join("vectors.toml"), text).unwrap();
}

#[test]
fn vectors_match_the_core_byte_for_byte() {
    let regen = std::env::var("CHEETAH_REGEN_VECTORS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for suite in suites() {
        let dir = vectors_dir().join(suite.name);
        if regen {
            regenerate(&suite, &dir);
        }
        let config = LbConfig::from_toml(&read(&dir.join("config.toml")))
            .unwrap_or_else(|e| panic!("{}: {e}", suite.name));
        let secret = Secret::from_hex(&read(&dir.join("secret.hex"))).expect("secret.hex");
        let file: VectorFile = toml::from_str(&read(&dir.join("vectors.toml")))
            .unwrap_or_else(|e| panic!("{}/vectors.toml: {e}", suite.name));
        assert_eq!(
            (&config, secret),
            (&suite.config, SECRET),
            "{}: config or secret differ from the definitions; regenerate",
            suite.name
        );
        assert_eq!(
            inputs_only(&file),
            defined(&suite),
            "{}: vector inputs differ from the definitions in tests/vectors.rs; regenerate",
            suite.name
        );
        for vector in &file.vector {
            let got = run(&config, &secret, &file.removed_servers, vector);
            if got != *vector {
                failures.push(format!(
                    "{}/{}: expected {} {}\n{:>width$}got {} {}",
                    suite.name,
                    vector.name,
                    vector.verdict,
                    vector.packet_out,
                    "",
                    got.verdict,
                    got.packet_out,
                    width = suite.name.len() + vector.name.len() + 3
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} vector(s) differ from the core's output:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every verdict the vectors promise to cover appears, so that a regeneration that
/// silently turned, say, the forged cookie into something else is noticed.
#[test]
fn vectors_cover_every_promised_verdict() {
    let mut seen = std::collections::BTreeSet::new();
    for suite in suites() {
        let text = read(&vectors_dir().join(suite.name).join("vectors.toml"));
        let file: VectorFile = toml::from_str(&text).unwrap();
        for v in file.vector {
            seen.insert(format!("{}: {}", suite.name, v.verdict));
            seen.insert(v.verdict);
        }
    }
    for expected in [
        "to_client",
        "to_all_servers:0",
        "pass",
        "drop:cookie_unknown_server",
        "drop:cookie_server_removed",
        "drop:server_removed",
        "drop:ts_msb_unknown",
        "drop:truncated_ethernet",
        "drop:truncated_ipv4",
        "drop:bad_ipv4_header_length",
        "drop:bad_ipv4_total_length",
        "drop:truncated_tcp",
        "drop:bad_tcp_data_offset",
        "drop:tcp_option_truncated",
        "drop:tcp_option_bad_length",
        "drop:tcp_option_overrun",
        "drop:bad_timestamp_option_length",
        "drop:unsupported_fragment",
        "drop:unsupported_udp",
        "drop:unsupported_ipv6",
        "drop:vip_port_unknown",
        "drop:unknown_server_source",
        "nat-cheetah: to_all_servers:0",
        "l2-hash: to_client",
        "l2-maglev: to_client",
        // An id only the 14 id bits of k = 2 carry.
        "l2-cheetah-k2: to_server:9000",
        "l2-cheetah-k6: to_server:2",
    ] {
        assert!(seen.contains(expected), "no vector has verdict {expected}");
    }
}
