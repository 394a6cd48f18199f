//! `cheetah testbed inject`: crafted frames from a client namespace, for the abuse tests.
//!
//! Run inside a client (`ip netns exec <prefix>-c0 cheetah testbed inject ...`). Frames
//! leave through an AF_PACKET socket on the client's interface, addressed to the MAC of
//! the client's default gateway, so they take the path the client's own TCP traffic takes.
//! From `c0` the gateway is the LB itself; from `c1`.. it is the router, whose IP layer
//! forwards well-formed packets but drops malformed IPv4 headers, so malformed frames must
//! come from `c0`.
//!
//! What is sent is built by [`crate::crafted`]; a JSON summary on stdout says how many
//! of each kind left and what the LB should do with them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use crate::crafted::{forged_acks, Addressing, Malformed, Outcome, SpoofedReply};
use anyhow::{bail, Context};
use cheetah_core::types::{format_mac, parse_mac, Mac};
use serde_json::{json, Value};

use super::shell::Cmd;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["forged_cookies", "malformed", "spoofed_replies"])))]
pub struct InjectArgs {
    /// Send N TCP ACKs to the target, each from a random client port (1024..=65535) with a
    /// random TSecr, so the LB decodes a random cookie from each.
    #[arg(long, value_name = "N")]
    forged_cookies: Option<u64>,
    /// Send --count-each frames of every malformed kind to the target.
    #[arg(long)]
    malformed: bool,
    /// Send N segments that claim to be a server's replies: from --from (a VIP:port in l2,
    /// a server's DIP:backend_port in nat) with TSval --tsval, to the target's address and
    /// N consecutive ports from the target's. The LB must learn nothing from them.
    #[arg(long, value_name = "N", requires_all = ["from", "tsval"])]
    spoofed_replies: Option<u16>,
    /// The server address and port a spoofed reply claims to come from.
    #[arg(long, value_name = "ADDR:PORT")]
    from: Option<SocketAddrV4>,
    /// The TSval of the spoofed replies.
    #[arg(long)]
    tsval: Option<u32>,
    /// The source MAC the frames claim [default: the interface's own].
    #[arg(long, value_name = "MAC", value_parser = parse_source_mac)]
    src_mac: Option<Mac>,
    /// The VIP and port the frames are addressed to.
    #[arg(long, value_name = "VIP:PORT")]
    target: SocketAddrV4,
    /// Seed of the forged segments: the same seed sends the same ports and timestamps.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Frames of each malformed kind.
    #[arg(long, default_value_t = 10, value_name = "K")]
    count_each: u32,
    /// Frames per second at most. The LB, its servers and this sender share the machine's
    /// cores; at this rate they keep up on two.
    #[arg(long, default_value_t = 20_000, value_name = "PPS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate: u32,
    /// The client's interface.
    #[arg(long, default_value = "eth0")]
    interface: String,
}

pub fn run(args: InjectArgs) -> anyhow::Result<()> {
    let link = ClientLink::discover(&args.interface)?;
    let to = Addressing {
        src_mac: args.src_mac.unwrap_or(link.mac),
        dst_mac: link.gateway_mac,
        src_ip: link.address,
        target: args.target,
    };
    let socket = PacketSocket::open(link.ifindex)?;
    let dropped_before = link.tx_dropped()?;
    let started = Instant::now();
    let mut pacer = Pacer::new(args.rate);
    let mut kinds = Vec::new();
    if let Some(count) = args.forged_cookies {
        for forged in forged_acks(args.seed).take(count as usize) {
            pacer.wait();
            socket.send(&forged.frame(&to))?;
        }
        kinds.push(json!({
            "kind": "forged_cookie",
            "sent": count,
            "seed": args.seed,
            "expected": "cookie_unknown_server for cookies that decode to an unallocated id, \
                         cookie_server_removed for a removed one, to the server otherwise",
        }));
    }
    if args.malformed {
        // Round-robin over the kinds, so a burst of one kind cannot hide in a queue.
        for n in 0..args.count_each {
            for kind in Malformed::ALL {
                pacer.wait();
                socket.send(&kind.frame(&to, n))?;
            }
        }
        for kind in Malformed::ALL {
            let (drop_reason, host_counter) = match kind.outcome() {
                Outcome::LbDrop(reason) => (Value::from(reason.name()), Value::Null),
                Outcome::HostIpHeaderError => (Value::Null, Value::from("Ip:InHdrErrors")),
            };
            kinds.push(json!({
                "kind": kind.name(),
                "sent": args.count_each,
                "expected_drop_reason": drop_reason,
                "expected_host_counter": host_counter,
                "what": kind.description(),
            }));
        }
    }
    if let (Some(count), Some(from), Some(tsval)) = (args.spoofed_replies, args.from, args.tsval) {
        for n in 0..count {
            pacer.wait();
            socket.send(&SpoofedReply { from, tsval, n }.frame(&to))?;
        }
        kinds.push(json!({
            "kind": "spoofed_reply",
            "sent": count,
            "from": from.to_string(),
            "tsval": tsval,
            "expected": "reply_from_client_side, or never learnt as the server's clock",
        }));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let sent = pacer.sent;
    let summary = json!({
        "interface": args.interface,
        "source_mac": format_mac(&to.src_mac),
        "source_ip": link.address.to_string(),
        "gateway_ip": link.gateway.to_string(),
        "gateway_mac": format_mac(&link.gateway_mac),
        "target": args.target.to_string(),
        "sent_total": sent,
        "seconds": elapsed,
        "rate_pps": if elapsed > 0.0 { sent as f64 / elapsed } else { 0.0 },
        // Frames the interface itself dropped (a full queue toward the peer): not every
        // frame counted as sent then reached the LB.
        "interface_tx_dropped": link.tx_dropped()?.saturating_sub(dropped_before),
        "kinds": kinds,
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

fn parse_source_mac(text: &str) -> anyhow::Result<Mac> {
    parse_mac(text).with_context(|| format!("`{text}` is not a MAC address (aa:bb:cc:dd:ee:ff)"))
}

/// The client's side of the link: its interface and its default gateway.
struct ClientLink {
    name: String,
    ifindex: u32,
    mac: Mac,
    address: Ipv4Addr,
    gateway: Ipv4Addr,
    gateway_mac: Mac,
}

impl ClientLink {
    fn discover(name: &str) -> anyhow::Result<Self> {
        let sys = format!("/sys/class/net/{name}");
        let ifindex: u32 = read_trimmed(&format!("{sys}/ifindex"))
            .with_context(|| format!("interface {name} does not exist in this namespace"))?
            .parse()?;
        let mac = parse_mac(&read_trimmed(&format!("{sys}/address"))?)
            .with_context(|| format!("interface {name}: not an Ethernet interface"))?;
        let address = ipv4_address(name)?;
        let gateway = default_gateway(name)?;
        let gateway_mac = match neighbour_mac(name, gateway)? {
            Some(mac) => mac,
            None => {
                // An idle client may have no entry yet: one ping makes the kernel resolve it.
                let _ = Cmd::new("ping")
                    .args(["-c", "1", "-W", "1", "-I", name, &gateway.to_string()])
                    .run();
                neighbour_mac(name, gateway)?.with_context(|| {
                    format!(
                        "no neighbour entry for the gateway {gateway} on {name}, even after a ping"
                    )
                })?
            }
        };
        Ok(ClientLink {
            name: name.to_string(),
            ifindex,
            mac,
            address,
            gateway,
            gateway_mac,
        })
    }

    fn tx_dropped(&self) -> anyhow::Result<u64> {
        Ok(read_trimmed(&format!(
            "/sys/class/net/{}/statistics/tx_dropped",
            self.name
        ))?
        .parse()?)
    }
}

fn read_trimmed(path: &str) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {path}"))?
        .trim()
        .to_string())
}

/// The interface's first IPv4 address (`ip -4 -o addr show dev NAME`).
fn ipv4_address(name: &str) -> anyhow::Result<Ipv4Addr> {
    let text = Cmd::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", name])
        .run()?;
    text.split_whitespace()
        .skip_while(|word| *word != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next()?.parse().ok())
        .with_context(|| format!("interface {name} has no IPv4 address"))
}

/// The gateway of the default route through `name`, from `/proc/net/route`.
fn default_gateway(name: &str) -> anyhow::Result<Ipv4Addr> {
    let table =
        std::fs::read_to_string("/proc/net/route").context("cannot read /proc/net/route")?;
    parse_default_gateway(&table, name)
        .with_context(|| format!("no default route with a gateway through {name}"))
}

/// `/proc/net/route` lines: Iface Destination Gateway Flags ..., addresses as hex of the
/// in-memory (network order) u32, which reads little-endian on every Linux we run on.
fn parse_default_gateway(table: &str, name: &str) -> Option<Ipv4Addr> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 || fields[0] != name || fields[1] != "00000000" {
            return None;
        }
        let gateway = u32::from_str_radix(fields[2], 16).ok()?;
        (gateway != 0).then(|| Ipv4Addr::from(gateway.to_le_bytes()))
    })
}

/// The gateway's MAC from `/proc/net/arp`, if the entry is complete.
fn neighbour_mac(name: &str, gateway: Ipv4Addr) -> anyhow::Result<Option<Mac>> {
    let table = std::fs::read_to_string("/proc/net/arp").context("cannot read /proc/net/arp")?;
    Ok(parse_neighbour(&table, name, gateway))
}

/// `/proc/net/arp` lines: IP, HW type, Flags, HW address, Mask, Device; flag 0x2 is a
/// complete entry.
fn parse_neighbour(table: &str, name: &str, ip: Ipv4Addr) -> Option<Mac> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || fields[5] != name || fields[0].parse::<Ipv4Addr>().ok()? != ip {
            return None;
        }
        let flags = u32::from_str_radix(fields[2].trim_start_matches("0x"), 16).ok()?;
        if flags & 0x2 == 0 {
            return None;
        }
        parse_mac(fields[3])
    })
}

/// An AF_PACKET socket that sends whole Ethernet frames out of one interface. It binds no
/// protocol, so the kernel never queues received frames on it.
struct PacketSocket {
    fd: libc::c_int,
    ifindex: u32,
}

impl PacketSocket {
    fn open(ifindex: u32) -> anyhow::Result<Self> {
        // SAFETY: plain socket(2) call; the fd is owned by the returned value.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            let error = std::io::Error::last_os_error();
            bail!("cannot open an AF_PACKET socket ({error}); inject needs root (CAP_NET_RAW)");
        }
        Ok(PacketSocket { fd, ifindex })
    }

    /// Sends one frame, waiting out a full transmit queue (ENOBUFS) rather than losing it.
    fn send(&self, frame: &[u8]) -> anyhow::Result<()> {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        to.sll_ifindex = self.ifindex as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&frame[..6]);
        let mut retries = 0;
        loop {
            // SAFETY: `frame` and `to` are valid for the lengths given.
            let sent = unsafe {
                libc::sendto(
                    self.fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&to as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if sent == frame.len() as isize {
                return Ok(());
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ENOBUFS) && retries < 1000 {
                retries += 1;
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            bail!("cannot send a {}-byte frame: {error}", frame.len());
        }
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: closing the fd this value owns.
        unsafe { libc::close(self.fd) };
    }
}

/// Spaces frames to at most `rate` per second. It sleeps only once it is a millisecond
/// ahead, because sleeps shorter than that overshoot: frames leave in bursts of
/// rate/1000 at most.
struct Pacer {
    started: Instant,
    nanos_per_frame: f64,
    sent: u64,
}

impl Pacer {
    fn new(rate: u32) -> Self {
        Pacer {
            started: Instant::now(),
            nanos_per_frame: 1e9 / f64::from(rate),
            sent: 0,
        }
    }

    /// Returns when the next frame may leave, and counts it.
    fn wait(&mut self) {
        let due = Duration::from_nanos((self.sent as f64 * self.nanos_per_frame) as u64);
        let elapsed = self.started.elapsed();
        if due > elapsed + Duration::from_millis(1) {
            std::thread::sleep(due - elapsed);
        }
        self.sent += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_gateway_is_read_from_the_route_table() {
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t01090A0A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     eth0\t00090A0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(
            parse_default_gateway(table, "eth0"),
            Some(Ipv4Addr::new(10, 10, 9, 1))
        );
        assert_eq!(parse_default_gateway(table, "eth1"), None);
    }

    #[test]
    fn only_complete_neighbour_entries_count() {
        let table = "IP address       HW type     Flags       HW address            Mask     Device\n\
                     10.10.9.1        0x1         0x2         02:ce:00:00:01:03     *        eth0\n\
                     10.10.9.7        0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        let gateway = Ipv4Addr::new(10, 10, 9, 1);
        assert_eq!(
            parse_neighbour(table, "eth0", gateway),
            Some([0x02, 0xce, 0, 0, 1, 3])
        );
        assert_eq!(
            parse_neighbour(table, "eth0", Ipv4Addr::new(10, 10, 9, 7)),
            None
        );
        assert_eq!(parse_neighbour(table, "eth1", gateway), None);
    }

    #[test]
    fn the_pacer_holds_the_rate() {
        let mut pacer = Pacer::new(20_000);
        let started = Instant::now();
        for _ in 0..1_000 {
            pacer.wait();
        }
        // 1000 frames at 20k/s take 50 ms; the first millisecond may go in a burst.
        assert!(
            started.elapsed() >= Duration::from_millis(48),
            "{:?}",
            started.elapsed()
        );
    }
}
