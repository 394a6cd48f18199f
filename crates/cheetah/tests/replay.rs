//! End-to-end tests of `cheetah replay`, through the built binary.
//!
//! The captures are built with `cheetah_core::testkit`, so they hold real wire bytes. A
//! conversation is grown the way it happens on the wire: the client's echo of a server
//! timestamp is the cookie the LB wrote into that server packet, so after each server packet
//! the capture so far is replayed and the cookie read from the replay's own output. That
//! also relies on (and so checks) replays being deterministic: a longer capture replays its
//! prefix exactly as before.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cheetah_core::hash::Secret;
use cheetah_core::testkit::{self, options, TcpFrame, CLIENT_MAC, LB_MAC, VIP};
use cheetah_core::types::format_mac;
use cheetah_core::wire::icmp;
use cheetah_core::wire::tcp::flags;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;
use tempfile::TempDir;

const KEY: &str = "000102030405060708090a0b0c0d0e0f";
const SERVERS: u16 = 3;
/// Capture timestamp of the first record: 2023-11-14T22:13:20Z.
const T0_NS: u64 = 1_700_000_000_000_000_000;
const CLIENT_PORT: u16 = 40_000;
const CLIENT_TS: u32 = 7_000_000;
const SERVER_TS: u32 = 0x1234_5678;
const ROUTER: u32 = 0x0a09_0001;

/// A config over servers `1..=SERVERS` (testkit's MACs and DIPs) with one round-robin VIP.
fn config_text(vip_servers: &str) -> String {
    config_with("l2", vip_servers)
}

fn config_with(forwarding: &str, vip_servers: &str) -> String {
    let mut text =
        format!("secret_file = \"key\"\nmode = \"cheetah\"\nforwarding = \"{forwarding}\"\n");
    for id in 1..=SERVERS {
        text += &format!(
            "\n[[servers]]\nid = {id}\ndip = \"{}\"\nmac = \"{}\"\n",
            Ipv4Addr::from(testkit::server_dip(id)),
            format_mac(&testkit::server_mac(id))
        );
    }
    text += &format!(
        "\n[[vips]]\naddress = \"{}\"\nport = {}\npolicy = \"rr\"\nservers = {vip_servers}\n",
        Ipv4Addr::from(VIP),
        testkit::VIP_PORT
    );
    text
}

/// A temporary folder with `cheetah.toml` and its `key`.
struct Lab {
    dir: TempDir,
}

impl Lab {
    fn new() -> Self {
        Self::with_config(&config_text("[1, 2, 3]"))
    }

    fn with_config(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cheetah.toml"), config).unwrap();
        std::fs::write(dir.path().join("key"), format!("{KEY}\n")).unwrap();
        Lab { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `frames` as a microsecond pcap, one millisecond apart from [`T0_NS`].
    fn write_pcap(&self, name: &str, frames: &[Vec<u8>]) -> PathBuf {
        self.write_pcap_with(name, DataLink::ETHERNET, frames)
    }

    fn write_pcap_with(&self, name: &str, datalink: DataLink, frames: &[Vec<u8>]) -> PathBuf {
        let path = self.path(name);
        let header = PcapHeader {
            datalink,
            ..Default::default()
        };
        let mut writer = PcapWriter::with_header(File::create(&path).unwrap(), header).unwrap();
        for (i, frame) in frames.iter().enumerate() {
            let packet = PcapPacket::new(record_time(i), frame.len() as u32, frame);
            writer.write_packet(&packet).unwrap();
        }
        path
    }

    /// Runs `cheetah replay --config cheetah.toml --input <input> --output out.pcap <extra>`.
    fn replay(&self, input: &Path, extra: &[&str]) -> Run {
        let output = self.path("out.pcap");
        let verdicts = self.path("out.pcap.verdicts.tsv");
        let _ = std::fs::remove_file(&output);
        let _ = std::fs::remove_file(&verdicts);
        let result = Command::new(env!("CARGO_BIN_EXE_cheetah"))
            .arg("replay")
            .arg("--config")
            .arg(self.path("cheetah.toml"))
            .arg("--input")
            .arg(input)
            .arg("--output")
            .arg(&output)
            .args(extra)
            .output()
            .unwrap();
        Run::read(result, &output, &verdicts)
    }
}

fn record_time(i: usize) -> Duration {
    Duration::from_nanos(T0_NS + i as u64 * 1_000_000)
}

/// One line of the verdict log.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    index: u64,
    time_ns: u64,
    worker: usize,
    verdict: String,
    server: String,
    reason: String,
}

struct Run {
    success: bool,
    stdout: String,
    stderr: String,
    /// The verdict log's raw text (empty if none was written).
    log: String,
    rows: Vec<Row>,
    /// The output pcap's records (timestamp, bytes).
    out: Vec<(Duration, Vec<u8>)>,
}

impl Run {
    fn read(result: Output, output: &Path, verdicts: &Path) -> Self {
        let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        let log = std::fs::read_to_string(verdicts).unwrap_or_default();
        let rows = log
            .lines()
            .skip(1)
            .map(|line| {
                let cols: Vec<&str> = line.split('\t').collect();
                assert_eq!(cols.len(), 6, "{line}");
                Row {
                    index: cols[0].parse().unwrap(),
                    time_ns: cols[1].parse().unwrap(),
                    worker: cols[2].parse().unwrap(),
                    verdict: cols[3].into(),
                    server: cols[4].into(),
                    reason: cols[5].into(),
                }
            })
            .collect();
        let mut out = Vec::new();
        if let Ok(file) = File::open(output) {
            let mut reader = PcapReader::new(file).unwrap();
            assert_eq!(reader.header().datalink, DataLink::ETHERNET);
            while let Some(packet) = reader.next_packet() {
                let packet = packet.unwrap();
                out.push((packet.timestamp, packet.data.into_owned()));
            }
        }
        Run {
            success: result.status.success(),
            stdout: String::from_utf8_lossy(&result.stdout).into_owned(),
            stderr,
            log,
            rows,
            out,
        }
    }

    fn ok(self) -> Self {
        assert!(self.success, "replay failed:\n{}", self.stderr);
        self
    }

    fn failed(self) -> Self {
        assert!(!self.success, "replay should have failed:\n{}", self.stdout);
        self
    }

    fn row(&self, index: u64) -> &Row {
        &self.rows[index as usize - 1]
    }

    /// The server a `to_server` row went to.
    fn server_of(&self, index: u64) -> u16 {
        let row = self.row(index);
        assert_eq!(row.verdict, "to_server", "{row:?}");
        row.server.parse().unwrap()
    }

    /// The output packet written for input record `index` (which must have written one).
    fn out_for(&self, index: u64) -> &[u8] {
        let before: usize = self.rows[..index as usize - 1].iter().map(written_by).sum();
        assert_eq!(written_by(self.row(index)), 1, "{:?}", self.row(index));
        &self.out[before].1
    }
}

/// How many output packets a verdict line stands for.
fn written_by(row: &Row) -> usize {
    match row.verdict.as_str() {
        "to_server" | "to_client" => 1,
        "to_all_servers" if row.server != "-" => row.server.split(',').count(),
        _ => 0,
    }
}

fn arp_request() -> Vec<u8> {
    let mut frame = vec![0u8; 42];
    frame[0..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&CLIENT_MAC);
    frame[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    frame[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    frame[22..28].copy_from_slice(&CLIENT_MAC);
    frame[28..32].copy_from_slice(&testkit::client_ip(1).to_be_bytes());
    frame[38..42].copy_from_slice(&VIP.to_be_bytes());
    frame
}

/// An Ethernet header saying IPv4, followed by only 10 bytes of IP header.
fn truncated_ipv4() -> Vec<u8> {
    let mut frame = vec![0u8; 24];
    frame[0..6].copy_from_slice(&LB_MAC);
    frame[6..12].copy_from_slice(&CLIENT_MAC);
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    frame[14] = 0x45;
    frame
}

fn client(flags: u8, seq: u32, ack: u32, opts: Vec<u8>, payload: &[u8]) -> Vec<u8> {
    let mut frame = TcpFrame::from_client(testkit::client_ip(1), CLIENT_PORT, flags, opts);
    frame.seq = seq;
    frame.ack = ack;
    frame.with_payload(payload).build()
}

fn server(id: u16, flags: u8, seq: u32, ack: u32, opts: Vec<u8>, payload: &[u8]) -> Vec<u8> {
    let mut frame = TcpFrame::from_server_l2(id, testkit::client_ip(1), CLIENT_PORT, flags, opts);
    frame.seq = seq;
    frame.ack = ack;
    frame.with_payload(payload).build()
}

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: example\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 204 No Content\r\n\r\n";

/// Input records of [`conversation`], numbered as in the verdict log.
mod rec {
    pub const ARP: u64 = 1;
    pub const GARBAGE: u64 = 2;
    pub const SYN: u64 = 3;
    pub const SYN_ACK: u64 = 4;
    pub const ACK: u64 = 5;
    pub const REQUEST: u64 = 6;
    pub const RESPONSE: u64 = 7;
    pub const ACK_RESPONSE: u64 = 8;
    pub const CLIENT_FIN: u64 = 9;
    pub const SERVER_FIN: u64 = 10;
    pub const LAST_ACK: u64 = 11;
    pub const ICMP_SHORT_QUOTE: u64 = 12;
    pub const ICMP_FULL_QUOTE: u64 = 13;
    pub const COUNT: u64 = 13;
}

/// The TSval the replay wrote into the output of server packet `index`: the cookie the
/// client echoes.
fn cookie_of(run: &Run, index: u64) -> u32 {
    testkit::timestamps(run.out_for(index)).unwrap().0
}

/// Grows a whole conversation, replaying after each server packet to learn its cookie.
/// Returns the capture's frames, the final run, and the server the SYN went to.
fn conversation(lab: &Lab, extra: &[&str]) -> (Vec<Vec<u8>>, Run, u16) {
    let replay = |frames: &[Vec<u8>]| lab.replay(&lab.write_pcap("in.pcap", frames), extra).ok();
    let mut frames = vec![
        arp_request(),
        truncated_ipv4(),
        client(flags::SYN, 1000, 0, options::linux_syn(CLIENT_TS, 0), b""),
    ];
    let s = replay(&frames).server_of(rec::SYN);
    let (syn_ack, ack) = (flags::SYN | flags::ACK, flags::ACK);
    let psh_ack = flags::PSH | flags::ACK;
    let fin_ack = flags::FIN | flags::ACK;
    frames.push(server(
        s,
        syn_ack,
        5000,
        1001,
        options::linux_syn(SERVER_TS, CLIENT_TS),
        b"",
    ));
    let cookie = cookie_of(&replay(&frames), rec::SYN_ACK);
    let ts = |tsval, tsecr| options::nop_nop_ts(tsval, tsecr);
    frames.push(client(ack, 1001, 5001, ts(CLIENT_TS + 1, cookie), b""));
    frames.push(client(
        psh_ack,
        1001,
        5001,
        ts(CLIENT_TS + 2, cookie),
        REQUEST,
    ));
    let request_end = 1001 + REQUEST.len() as u32;
    frames.push(server(
        s,
        psh_ack,
        5001,
        request_end,
        ts(SERVER_TS + 3, CLIENT_TS + 2),
        RESPONSE,
    ));
    let cookie = cookie_of(&replay(&frames), rec::RESPONSE);
    let response_end = 5001 + RESPONSE.len() as u32;
    frames.push(client(
        ack,
        request_end,
        response_end,
        ts(CLIENT_TS + 3, cookie),
        b"",
    ));
    frames.push(client(
        fin_ack,
        request_end,
        response_end,
        ts(CLIENT_TS + 4, cookie),
        b"",
    ));
    frames.push(server(
        s,
        fin_ack,
        response_end,
        request_end + 1,
        ts(SERVER_TS + 5, CLIENT_TS + 4),
        b"",
    ));
    let run = replay(&frames);
    let cookie = cookie_of(&run, rec::SERVER_FIN);
    frames.push(client(
        ack,
        request_end + 1,
        response_end + 1,
        ts(CLIENT_TS + 5, cookie),
        b"",
    ));
    // A router's "fragmentation needed" about the response the LB sent toward the client:
    // quoting only 8 bytes of TCP it carries no cookie (copied to every server), quoting
    // the whole header it does (routed to the one server).
    let response_out = run.out_for(rec::RESPONSE).to_vec();
    frames.push(testkit::icmp_frag_needed(ROUTER, &response_out, 28));
    frames.push(testkit::icmp_frag_needed(ROUTER, &response_out, 200));
    let run = replay(&frames);
    (frames, run, s)
}

/// The TSecr a client packet carried into the replay, and the one it left with.
fn tsecr_in_and_out(frames: &[Vec<u8>], run: &Run, index: u64) -> (u32, u32) {
    let sent = testkit::timestamps(&frames[index as usize - 1]).unwrap().1;
    let delivered = testkit::timestamps(run.out_for(index)).unwrap().1;
    (sent, delivered)
}

fn check_conversation(frames: &[Vec<u8>], run: &Run, s: u16) {
    assert_eq!(
        run.log.lines().next(),
        Some("index\ttime_ns\tworker\tverdict\tserver\treason")
    );
    assert_eq!(run.rows.len() as u64, rec::COUNT);
    for (i, row) in run.rows.iter().enumerate() {
        assert_eq!(row.index, i as u64 + 1);
        assert_eq!(Duration::from_nanos(row.time_ns), record_time(i));
    }
    let arp = run.row(rec::ARP);
    assert_eq!(
        (
            arp.verdict.as_str(),
            arp.server.as_str(),
            arp.reason.as_str()
        ),
        ("pass", "-", "-")
    );
    let garbage = run.row(rec::GARBAGE);
    assert_eq!(
        (
            garbage.verdict.as_str(),
            garbage.server.as_str(),
            garbage.reason.as_str()
        ),
        ("drop", "-", "truncated_ipv4")
    );
    // Every client packet reaches the server the SYN was placed on.
    for index in [
        rec::SYN,
        rec::ACK,
        rec::REQUEST,
        rec::ACK_RESPONSE,
        rec::CLIENT_FIN,
        rec::LAST_ACK,
    ] {
        assert_eq!(run.server_of(index), s, "record {index}");
        assert_eq!(run.row(index).reason, "-");
        assert_eq!(
            &run.out_for(index)[0..6],
            &testkit::server_mac(s),
            "record {index}"
        );
    }
    for index in [rec::SYN_ACK, rec::RESPONSE, rec::SERVER_FIN] {
        let row = run.row(index);
        assert_eq!(
            (row.verdict.as_str(), row.server.as_str()),
            ("to_client", "-")
        );
        // The cookie replaced the server's TSval; the client's TSecr passed untouched.
        let (tsval_in, tsecr_in) = testkit::timestamps(&frames[index as usize - 1]).unwrap();
        let (tsval_out, tsecr_out) = testkit::timestamps(run.out_for(index)).unwrap();
        assert_ne!(tsval_out, tsval_in, "record {index}");
        assert_eq!(tsecr_out, tsecr_in, "record {index}");
    }
    // The server gets back exactly the TSval it sent, not the cookie the client echoed.
    for (index, server_tsval) in [
        (rec::ACK, SERVER_TS),
        (rec::REQUEST, SERVER_TS),
        (rec::ACK_RESPONSE, SERVER_TS + 3),
        (rec::CLIENT_FIN, SERVER_TS + 3),
        (rec::LAST_ACK, SERVER_TS + 5),
    ] {
        let (echoed, delivered) = tsecr_in_and_out(frames, run, index);
        assert_ne!(echoed, server_tsval, "record {index} should echo a cookie");
        assert_eq!(delivered, server_tsval, "record {index}");
    }
    let short = run.row(rec::ICMP_SHORT_QUOTE);
    assert_eq!(
        (short.verdict.as_str(), short.server.as_str()),
        ("to_all_servers", "1,2,3")
    );
    assert_eq!(run.server_of(rec::ICMP_FULL_QUOTE), s);

    // 7 to_server + 3 to_client + 3 copies; nothing for the ARP and the garbage.
    assert_eq!(run.out.len(), 13);
    // Records 3..=11 are the TCP conversation, then the copies of record 12, then 13.
    for (ts, frame) in &run.out[..9] {
        assert!(testkit::checksums_valid(frame), "{frame:02x?}");
        assert!(record_time(0) <= *ts && *ts <= record_time(rec::COUNT as usize));
    }
    for (copy, id) in run.out[9..12].iter().zip(1..) {
        assert_eq!(copy.0, record_time(rec::ICMP_SHORT_QUOTE as usize - 1));
        assert_eq!(&copy.1[0..6], &testkit::server_mac(id));
        assert!(icmp::checksum_is_valid(&copy.1[34..]));
    }
    let routed = run.out_for(rec::ICMP_FULL_QUOTE);
    assert_eq!(&routed[0..6], &testkit::server_mac(s));
    assert!(icmp::checksum_is_valid(&routed[34..]));
    assert!(run.stdout.contains("packets in       13"), "{}", run.stdout);
    assert!(run.stdout.contains("packets out      13"), "{}", run.stdout);
    assert!(run.stdout.contains("truncated_ipv4"), "{}", run.stdout);
    let fingerprint = Secret::from_hex(KEY)
        .unwrap()
        .fingerprint(cheetah_core::cookie::CookieLayout::DEFAULT);
    assert!(run.stdout.contains(&fingerprint), "{}", run.stdout);
}

#[test]
fn a_whole_conversation_keeps_its_server_and_gets_its_timestamps_restored() {
    let lab = Lab::new();
    let (frames, run, s) = conversation(&lab, &[]);
    check_conversation(&frames, &run, s);
    assert!(run.rows.iter().all(|row| row.worker == 0));
    // Output timestamps are the input records'.
    assert_eq!(run.out[0].0, record_time(rec::SYN as usize - 1));
    assert_eq!(run.out[1].0, record_time(rec::SYN_ACK as usize - 1));

    // Replaying again gives the same bytes.
    let again = lab.replay(&lab.path("in.pcap"), &[]).ok();
    assert_eq!(again.log, run.log);
    assert_eq!(again.out, run.out);
}

#[test]
fn with_several_workers_both_directions_of_a_flow_meet_one_worker() {
    let lab = Lab::new();
    let (frames, run, s) = conversation(&lab, &["--workers", "3"]);
    check_conversation(&frames, &run, s);
    let flow_worker = run.row(rec::SYN).worker;
    for index in rec::SYN..=rec::LAST_ACK {
        assert_eq!(run.row(index).worker, flow_worker, "record {index}");
    }
    assert_eq!(run.row(rec::ARP).worker, 0);
    assert!(run.stdout.contains("workers          3"), "{}", run.stdout);

    // Many flows: each meets one worker both ways, and all three workers get some.
    let mut frames = Vec::new();
    for n in 0..24u32 {
        let client_ip = testkit::client_ip(n * 37 + 1);
        let port = 33_000 + 101 * n as u16;
        let syn = TcpFrame::from_client(client_ip, port, flags::SYN, options::linux_syn(n, 0));
        let syn_ack = TcpFrame::from_server_l2(
            1 + (n % 3) as u16,
            client_ip,
            port,
            flags::SYN | flags::ACK,
            options::linux_syn(SERVER_TS, n),
        );
        frames.push(syn.build());
        frames.push(syn_ack.build());
    }
    let run = lab
        .replay(&lab.write_pcap("flows.pcap", &frames), &["--workers", "3"])
        .ok();
    let mut used = [false; 3];
    for pair in run.rows.chunks(2) {
        assert_eq!(pair[0].verdict, "to_server");
        assert_eq!(pair[1].verdict, "to_client");
        assert_eq!(pair[0].worker, pair[1].worker, "{pair:?}");
        used[pair[0].worker] = true;
    }
    assert_eq!(used, [true; 3]);
}

#[test]
fn pcapng_input_replays_like_pcap() {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::{
        InterfaceDescriptionBlock, InterfaceDescriptionOption,
    };
    use pcap_file::pcapng::PcapNgWriter;

    let lab = Lab::new();
    let (frames, run, _) = conversation(&lab, &[]);
    let path = lab.path("in.pcapng");
    let mut writer = PcapNgWriter::new(File::create(&path).unwrap()).unwrap();
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            // Nanosecond timestamps: pcap-file 2 writes the raw count in nanoseconds.
            options: vec![InterfaceDescriptionOption::IfTsResol(9)],
        })
        .unwrap();
    for (i, frame) in frames.iter().enumerate() {
        writer
            .write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: record_time(i),
                original_len: frame.len() as u32,
                data: frame.as_slice().into(),
                options: vec![],
            })
            .unwrap();
    }
    drop(writer);
    let ng = lab.replay(&path, &[]).ok();
    assert_eq!(ng.log, run.log);
    assert_eq!(ng.out, run.out);
}

#[test]
fn a_truncated_record_is_reported_by_number_after_replaying_the_rest() {
    let lab = Lab::new();
    let frames = vec![
        arp_request(),
        client(flags::SYN, 1000, 0, options::linux_syn(CLIENT_TS, 0), b""),
        client(flags::SYN, 1000, 0, options::linux_syn(CLIENT_TS, 0), b""),
    ];
    let path = lab.write_pcap("cut.pcap", &frames);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 20]).unwrap();
    let run = lab.replay(&path, &[]).failed();
    assert!(run.stderr.contains("cut.pcap"), "{}", run.stderr);
    assert!(run.stderr.contains("record 3"), "{}", run.stderr);
    assert!(run.stderr.contains("cut short"), "{}", run.stderr);
    // The records before the bad one were replayed and written.
    assert_eq!(run.rows.len(), 2);
    assert_eq!(run.out.len(), 1);
    assert!(run.stdout.contains("packets in       2"), "{}", run.stdout);
}

#[test]
fn a_capture_that_is_not_ethernet_is_refused_naming_its_link_type() {
    let lab = Lab::new();
    let path = lab.write_pcap_with("sll.pcap", DataLink::LINUX_SLL, &[arp_request()]);
    let run = lab.replay(&path, &[]).failed();
    assert!(run.stderr.contains("sll.pcap"), "{}", run.stderr);
    assert!(run.stderr.contains("LINUX_SLL (113)"), "{}", run.stderr);
    assert!(run.stderr.contains("Ethernet"), "{}", run.stderr);
}

#[test]
fn a_config_error_names_the_field() {
    let lab = Lab::with_config(&config_text("[1, 2, 9]"));
    let input = lab.write_pcap("in.pcap", &[arp_request()]);
    let run = lab.replay(&input, &[]).failed();
    assert!(run.stderr.contains("cheetah.toml"), "{}", run.stderr);
    assert!(run.stderr.contains("vips[0].servers[2]"), "{}", run.stderr);
    assert!(
        run.stderr.contains("server 9 is not defined"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_missing_or_bad_secret_file_is_named() {
    let lab = Lab::new();
    let input = lab.write_pcap("in.pcap", &[arp_request()]);
    let missing = lab.path("no-such-key");
    let run = lab
        .replay(&input, &["--secret-file", missing.to_str().unwrap()])
        .failed();
    assert!(
        run.stderr.contains("cannot read secret file"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("no-such-key"), "{}", run.stderr);

    std::fs::write(lab.path("key"), "not hex\n").unwrap();
    let run = lab.replay(&input, &[]).failed();
    assert!(run.stderr.contains("32 hex digits"), "{}", run.stderr);
    assert!(run.stderr.contains("key"), "{}", run.stderr);

    let no_secret = config_text("[1, 2, 3]").replace("secret_file = \"key\"\n", "");
    std::fs::write(lab.path("cheetah.toml"), no_secret).unwrap();
    let run = lab.replay(&input, &[]).failed();
    assert!(run.stderr.contains("--secret-file"), "{}", run.stderr);
}

#[test]
fn missing_input_and_clobbering_the_input_are_refused() {
    let lab = Lab::new();
    let run = lab.replay(&lab.path("nowhere.pcap"), &[]).failed();
    assert!(run.stderr.contains("cannot open input"), "{}", run.stderr);
    assert!(run.stderr.contains("nowhere.pcap"), "{}", run.stderr);

    let input = lab.write_pcap("in.pcap", &[arp_request()]);
    let before = std::fs::read(&input).unwrap();
    let run = lab
        .replay(&input, &["--verdicts", input.to_str().unwrap()])
        .failed();
    assert!(run.stderr.contains("same file"), "{}", run.stderr);
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

#[test]
fn verdicts_go_where_asked() {
    let lab = Lab::new();
    let input = lab.write_pcap("in.pcap", &[arp_request(), truncated_ipv4()]);
    let log = lab.path("log.tsv");
    let run = lab
        .replay(&input, &["--verdicts", log.to_str().unwrap()])
        .ok();
    assert!(run.rows.is_empty(), "the default log should not be written");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[1].ends_with("\tpass\t-\t-"), "{text}");
    assert!(lines[2].ends_with("\tdrop\t-\ttruncated_ipv4"), "{text}");
    assert!(run.out.is_empty());
}

#[test]
fn packets_cut_by_the_snap_length_are_replayed_as_captured_and_flagged() {
    let lab = Lab::new();
    let syn = client(flags::SYN, 1000, 0, options::linux_syn(CLIENT_TS, 0), b"");
    let request = client(flags::ACK, 1001, 5001, options::nop_nop_ts(1, 2), REQUEST);
    // As `tcpdump -s 80` saves them: 80 bytes kept, the wire length recorded.
    let path = lab.path("snapped.pcap");
    let mut writer = PcapWriter::new(File::create(&path).unwrap()).unwrap();
    for (i, frame) in [&syn, &request].into_iter().enumerate() {
        let kept = &frame[..frame.len().min(80)];
        let packet = PcapPacket::new(record_time(i), frame.len() as u32, kept);
        writer.write_packet(&packet).unwrap();
    }
    drop(writer);
    let run = lab.replay(&path, &[]).ok();
    assert_eq!(run.row(1).verdict, "to_server");
    assert_eq!(run.row(2).reason, "bad_ipv4_total_length");
    assert!(run.stdout.contains("1 packets were cut"), "{}", run.stdout);
}

#[test]
fn nat_mode_translates_both_ways() {
    let lab = Lab::with_config(&config_with("nat", "[1, 2, 3]"));
    let syn = client(flags::SYN, 1000, 0, options::linux_syn(CLIENT_TS, 0), b"");
    let run = lab
        .replay(&lab.write_pcap("in.pcap", std::slice::from_ref(&syn)), &[])
        .ok();
    let s = run.server_of(1);
    let (_, dst, _, _) = testkit::addresses(run.out_for(1)).unwrap();
    assert_eq!(dst, testkit::server_dip(s));
    let syn_ack = TcpFrame::from_server_nat(
        s,
        testkit::client_ip(1),
        CLIENT_PORT,
        flags::SYN | flags::ACK,
        options::linux_syn(SERVER_TS, CLIENT_TS),
    )
    .build();
    let run = lab
        .replay(&lab.write_pcap("in.pcap", &[syn, syn_ack]), &[])
        .ok();
    assert_eq!(run.row(2).verdict, "to_client");
    let reply = run.out_for(2);
    assert_eq!(testkit::addresses(reply).unwrap().0, VIP);
    assert!(testkit::checksums_valid(reply));
}
