//! Puts a server's own timestamp clock on its interface: loads `bpf/server_clock.c` with the
//! server's offset and attaches it with tc (clsact, ingress and egress) inside the server's
//! namespace. The filters hold the program, so it stays in effect after this process ends,
//! until the namespace goes.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{bail, Context};
use libbpf_rs::{Object, ObjectBuilder, TcHookBuilder, TC_EGRESS, TC_INGRESS};

static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/server_clock.o"));

pub const EGRESS_PROGRAM: &str = "server_clock_egress";
pub const INGRESS_PROGRAM: &str = "server_clock_ingress";

/// The program with `offset` baked into its read-only data, loaded into the kernel.
pub fn load(offset: u32) -> anyhow::Result<Object> {
    let mut open = ObjectBuilder::default()
        .open_memory(PROGRAM)
        .context("cannot open the embedded server clock program")?;
    let mut rodata = open
        .maps_mut()
        .find(|m| m.name().to_string_lossy().ends_with(".rodata"))
        .context("bpf/server_clock.c has no read-only data: where is clock_offset?")?;
    let value = rodata
        .initial_value_mut()
        .context("the server clock program's read-only data has no initial value")?;
    // clock_offset is its only global: anything else in .rodata would shift it.
    if value.len() != 4 {
        bail!(
            "bpf/server_clock.c's read-only data is {} bytes, expected clock_offset alone",
            value.len()
        );
    }
    value.copy_from_slice(&offset.to_ne_bytes());
    open.load()
        .context("the kernel refused the server clock program (needs root and BPF)")
}

/// Attaches the program with `offset` to `interface` in network namespace `namespace` (a
/// name under /run/netns), replacing one attached before.
pub fn attach(namespace: &str, interface: &str, offset: u32) -> anyhow::Result<()> {
    let namespace_file = format!("/run/netns/{namespace}");
    let interface = interface.to_string();
    // setns changes the calling thread's namespace only: a thread of its own keeps the
    // rest of the process where it was. Netlink sockets and ifindex lookups then act there.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = File::open(&namespace_file)
                    .with_context(|| format!("cannot open {namespace_file}"))?;
                // SAFETY: setns takes a valid fd of a namespace file and a namespace type.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error())
                        .with_context(|| format!("cannot enter namespace {namespace}"));
                }
                attach_here(&interface, offset).with_context(|| format!("in namespace {namespace}"))
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn attach_here(interface: &str, offset: u32) -> anyhow::Result<()> {
    let name = std::ffi::CString::new(interface).context("interface name")?;
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        bail!("no interface {interface}");
    }
    let object = load(offset)?;
    let points = [(EGRESS_PROGRAM, TC_EGRESS), (INGRESS_PROGRAM, TC_INGRESS)];
    for (i, (program, point)) in points.into_iter().enumerate() {
        let prog = object
            .progs()
            .find(|p| p.name() == program)
            .unwrap_or_else(|| panic!("program {program} is missing from bpf/server_clock.c"));
        let mut hook = TcHookBuilder::new(prog.as_fd())
            .ifindex(ifindex as i32)
            .replace(true)
            .handle(1)
            .priority(1)
            .hook(point);
        // One clsact qdisc holds both hooks; creating it again fails with EEXIST, which
        // libbpf would report on stderr for every server.
        if i == 0 {
            hook.create()
                .with_context(|| format!("cannot add a clsact qdisc to {interface}"))?;
        }
        hook.attach()
            .with_context(|| format!("cannot attach {program} to {interface}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The program run on crafted frames with BPF_PROG_TEST_RUN (root only): what it
    //! changes, what it leaves alone, and that the TCP checksum stays valid.

    use super::*;
    use libbpf_rs::ProgramInput;

    const OFFSET: u32 = 0x8000_1234;
    const TSVAL: u32 = 0x7fff_f000;
    const TSECR: u32 = 0x0123_4567;
    const ACK: u8 = 0x10;
    const SYN: u8 = 0x02;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("\n*** SKIPPED server_clock BPF tests: need root (BPF_PROG_TEST_RUN) ***\n");
        }
        root
    }

    /// Ethernet + IPv4 + TCP with `options` (padded with EOL to a multiple of 4) and a
    /// few payload bytes, with a valid TCP checksum.
    fn frame(flags: u8, options: &[u8]) -> Vec<u8> {
        let mut options = options.to_vec();
        while !options.len().is_multiple_of(4) {
            options.push(0);
        }
        let payload = b"hello";
        let tcp_len = 20 + options.len() + payload.len();
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let total = (20 + tcp_len) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[10, 20, 0, 11, 10, 10, 11, 2]);
        let ip_sum = !fold(sum16(&ip));
        ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
        f.extend_from_slice(&ip);
        let mut tcp = vec![0, 80, 0x9c, 0x40, 0, 0, 0, 1, 0, 0, 0, 2];
        tcp.push((((20 + options.len()) / 4) as u8) << 4);
        tcp.extend_from_slice(&[flags, 0xff, 0xff, 0, 0, 0, 0]);
        tcp.extend_from_slice(&options);
        tcp.extend_from_slice(payload);
        f.extend_from_slice(&tcp);
        let check = tcp_checksum(&f);
        f[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&check.to_be_bytes());
        f
    }

    fn sum16(bytes: &[u8]) -> u32 {
        bytes
            .chunks(2)
            .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
            .sum()
    }

    fn fold(mut sum: u32) -> u16 {
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// The checksum the segment in `frame` should carry (its own field counted as 0).
    fn tcp_checksum(frame: &[u8]) -> u16 {
        let ip = &frame[14..34];
        let mut tcp = frame[34..].to_vec();
        tcp[16] = 0;
        tcp[17] = 0;
        let mut pseudo = ip[12..20].to_vec();
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        !fold(sum16(&pseudo) + sum16(&tcp))
    }

    fn timestamp_option(tsval: u32, tsecr: u32) -> Vec<u8> {
        let mut option = vec![8, 10];
        option.extend_from_slice(&tsval.to_be_bytes());
        option.extend_from_slice(&tsecr.to_be_bytes());
        option
    }

    /// Runs `program` with `offset` on `input`; the frame it leaves.
    fn run(program: &str, offset: u32, input: &[u8]) -> Vec<u8> {
        let object = load(offset).unwrap();
        let prog = object.progs_mut().find(|p| p.name() == program).unwrap();
        let mut out = vec![0u8; input.len() + 256];
        let run = ProgramInput {
            data_in: Some(input),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let result = prog.test_run(run).unwrap();
        assert_eq!(result.return_value, 0, "TC_ACT_OK, never a drop");
        let len = result.data.as_ref().unwrap().len();
        out.truncate(len);
        out
    }

    fn word(frame: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(frame[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn egress_adds_the_offset_to_tsval_at_any_alignment() {
        if !root() {
            return;
        }
        // Options start at frame offset 54; padding of 0..=3 NOPs moves TSval through every
        // alignment, with a window scale or MSS option in front for good measure.
        for nops in 0..4 {
            for lead in [&[][..], &[3, 3, 7][..], &[2, 4, 5, 0xb4][..]] {
                let mut options = lead.to_vec();
                options.extend(std::iter::repeat_n(1, nops));
                let tsval_at = 54 + options.len() + 2;
                options.extend(timestamp_option(TSVAL, TSECR));
                for flags in [SYN, SYN | ACK, ACK] {
                    let input = frame(flags, &options);
                    let output = run(EGRESS_PROGRAM, OFFSET, &input);
                    let what = format!("{nops} NOPs after {lead:?}, flags {flags:#x}");
                    assert_eq!(
                        word(&output, tsval_at),
                        TSVAL.wrapping_add(OFFSET),
                        "{what}"
                    );
                    assert_eq!(word(&output, tsval_at + 4), TSECR, "{what}: TSecr kept");
                    let check = u16::from_be_bytes([output[50], output[51]]);
                    assert_eq!(check, tcp_checksum(&output), "{what}: checksum");
                    let mut expected = input.clone();
                    expected[50..52].copy_from_slice(&output[50..52]);
                    expected[tsval_at..tsval_at + 4]
                        .copy_from_slice(&TSVAL.wrapping_add(OFFSET).to_be_bytes());
                    assert_eq!(output, expected, "{what}: nothing else changed");
                }
            }
        }
    }

    #[test]
    fn ingress_subtracts_the_offset_from_tsecr_only_when_ack_is_set() {
        if !root() {
            return;
        }
        for nops in 0..4 {
            let mut options = vec![1; nops];
            let tsecr_at = 54 + nops + 6;
            options.extend(timestamp_option(TSVAL, TSECR));
            let input = frame(ACK, &options);
            let output = run(INGRESS_PROGRAM, OFFSET, &input);
            assert_eq!(
                word(&output, tsecr_at),
                TSECR.wrapping_sub(OFFSET),
                "{nops}"
            );
            assert_eq!(word(&output, tsecr_at - 4), TSVAL, "{nops}: TSval kept");
            let check = u16::from_be_bytes([output[50], output[51]]);
            assert_eq!(check, tcp_checksum(&output), "{nops}: checksum");

            let syn = frame(SYN, &options);
            assert_eq!(
                run(INGRESS_PROGRAM, OFFSET, &syn),
                syn,
                "a SYN's TSecr means nothing"
            );
        }
    }

    #[test]
    fn what_it_cannot_parse_goes_through_untouched() {
        if !root() {
            return;
        }
        let ts = timestamp_option(TSVAL, TSECR);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("no options", frame(ACK, &[])),
            (
                "EOL before the timestamp",
                frame(ACK, &[&[0, 1][..], &ts].concat()),
            ),
            (
                "an option of length 1",
                frame(ACK, &[&[3, 1][..], &ts].concat()),
            ),
            (
                "an option running past the header",
                frame(ACK, &[1, 1, 3, 30]),
            ),
            (
                "a timestamp of length 8",
                frame(ACK, &[8, 8, 1, 2, 3, 4, 5, 6]),
            ),
            ("a timestamp cut by the header's end", {
                let mut f = frame(ACK, &[&[1, 1][..], &ts].concat());
                // Data offset 7: the option's last bytes fall outside the header.
                f[46] = 7 << 4;
                f
            }),
            ("a non-first fragment", {
                let mut f = frame(ACK, &ts);
                f[20] = 0x00;
                f[21] = 0x10;
                f
            }),
            ("UDP", {
                let mut f = frame(ACK, &ts);
                f[23] = 17;
                f
            }),
            (
                "a frame cut in the TCP header",
                frame(ACK, &ts)[..44].to_vec(),
            ),
        ];
        for (what, input) in cases {
            for program in [EGRESS_PROGRAM, INGRESS_PROGRAM] {
                assert_eq!(run(program, OFFSET, &input), input, "{program}: {what}");
            }
        }
        // Forty NOPs: the loop's bound, with no option to find.
        let nops = frame(ACK, &[1; 40]);
        assert_eq!(run(EGRESS_PROGRAM, OFFSET, &nops), nops);
    }

    #[test]
    fn egress_then_ingress_gives_the_server_its_own_clock_back() {
        if !root() {
            return;
        }
        for offset in [1, 32_768, 0x8000_0000, u32::MAX] {
            let sent = frame(ACK, &timestamp_option(TSVAL, 0));
            let on_wire = run(EGRESS_PROGRAM, offset, &sent);
            let wire_tsval = word(&on_wire, 56);
            // The peer echoes the wire value; the server must see its own.
            let echo = frame(ACK, &timestamp_option(7, wire_tsval));
            let seen = run(INGRESS_PROGRAM, offset, &echo);
            assert_eq!(word(&seen, 60), TSVAL, "offset {offset:#x}");
        }
    }
}
