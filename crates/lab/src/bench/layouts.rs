//! TCP option layouts and how often each occurs, after the paper's Table 1.
//!
//! The cost of finding the timestamp depends on the layout (one wide compare for Table 1's
//! rows, a TLV walk for the rest), so a benchmark on Linux-only options would flatter the
//! pipeline. The trace draws every packet's layout from these mixes, non-Linux orders and a
//! slow-path share included.

use cheetah_core::testkit::options;
use cheetah_core::wire::tcp_options::kind;

/// One option layout. Names follow the option order on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// Linux SYN and SYN-ACK: MSS SAckOK TS NOP WS.
    LinuxSyn,
    /// macOS / iOS SYN: MSS NOP WS NOP NOP TS SAckOK EOL.
    AppleSyn,
    /// MSS NOP WS SAckOK TS.
    MssNopWsSackOkTs,
    /// SYN-ACK to a client that offered no window scaling: MSS NOP NOP TS SAckOK EOL.
    MssNopNopTsSackOk,
    /// Slow path: MSS WS TS EOL (timestamp at an odd offset).
    OddOffsetTs,
    /// Slow path: TS NOP NOP (timestamp first).
    TsFirst,
    /// Established: NOP NOP TS.
    NopNopTs,
    /// Established with one SACK block: NOP NOP TS NOP NOP SACK.
    NopNopTsSack,
    /// Windows SYN / SYN-ACK without timestamps: MSS NOP WS NOP NOP SAckOK.
    WindowsSyn,
    /// Established without timestamps: no options at all.
    NoOptions,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::LinuxSyn => "mss,sackok,ts,nop,ws",
            Layout::AppleSyn => "mss,nop,ws,nop,nop,ts,sackok,eol",
            Layout::MssNopWsSackOkTs => "mss,nop,ws,sackok,ts",
            Layout::MssNopNopTsSackOk => "mss,nop,nop,ts,sackok,eol",
            Layout::OddOffsetTs => "mss,ws,ts,eol (slow)",
            Layout::TsFirst => "ts,nop,nop (slow)",
            Layout::NopNopTs => "nop,nop,ts",
            Layout::NopNopTsSack => "nop,nop,ts,nop,nop,sack",
            Layout::WindowsSyn => "mss,nop,ws,nop,nop,sackok (no ts)",
            Layout::NoOptions => "none (no ts)",
        }
    }

    pub fn has_timestamp(self) -> bool {
        !matches!(self, Layout::WindowsSyn | Layout::NoOptions)
    }

    /// Whether the layout is one of Table 1's rows, i.e. found by the fast path.
    pub fn is_table1(self) -> bool {
        self.has_timestamp() && !matches!(self, Layout::OddOffsetTs | Layout::TsFirst)
    }

    /// The option bytes (padded to 32 bits) with this TSval and TSecr.
    pub fn options(self, tsval: u32, tsecr: u32) -> Vec<u8> {
        match self {
            Layout::LinuxSyn => options::linux_syn(tsval, tsecr),
            Layout::AppleSyn => options::apple_syn(tsval, tsecr),
            Layout::MssNopWsSackOkTs => options::mss_nop_ws_sackok_ts(tsval, tsecr),
            Layout::MssNopNopTsSackOk => {
                let mut o = vec![kind::MSS, 4, 0x05, 0xb4, kind::NOP, kind::NOP];
                o.extend_from_slice(&options::nop_nop_ts(tsval, tsecr)[2..]);
                o.extend_from_slice(&[kind::SACK_PERMITTED, 2, kind::END, kind::END]);
                o
            }
            Layout::OddOffsetTs => options::odd_offset_ts(tsval, tsecr),
            Layout::TsFirst => options::ts_first(tsval, tsecr),
            Layout::NopNopTs => options::nop_nop_ts(tsval, tsecr),
            Layout::NopNopTsSack => options::nop_nop_ts_sack(tsval, tsecr),
            Layout::WindowsSyn => options::windows_syn(),
            Layout::NoOptions => Vec::new(),
        }
    }
}

/// Client SYNs of timestamp-speaking clients: Linux ~50%, Apple ~44%, the third Table 1
/// row ~4.5%, and ~1% of layouts that only the TLV walk finds.
pub const SYN_MIX: &[(Layout, f64)] = &[
    (Layout::LinuxSyn, 0.505),
    (Layout::AppleSyn, 0.44),
    (Layout::MssNopWsSackOkTs, 0.045),
    (Layout::OddOffsetTs, 0.005),
    (Layout::TsFirst, 0.005),
];

/// Server SYN-ACKs: mostly the Linux layout, the other Table 1 SYN-ACK rows for the rest.
pub const SYN_ACK_MIX: &[(Layout, f64)] = &[
    (Layout::LinuxSyn, 0.90),
    (Layout::MssNopWsSackOkTs, 0.05),
    (Layout::MssNopNopTsSackOk, 0.03),
    (Layout::AppleSyn, 0.02),
];

/// Every non-SYN segment, both directions: NOP NOP TS 98.5%, with SACK 1.5%, slow 0.05%.
pub const ESTABLISHED_MIX: &[(Layout, f64)] = &[
    (Layout::NopNopTs, 0.9845),
    (Layout::NopNopTsSack, 0.015),
    (Layout::TsFirst, 0.0005),
];

#[cfg(test)]
mod tests {
    use super::*;
    use cheetah_core::wire::tcp_options::{find_timestamp, SegmentKind};

    /// `is_table1` must agree with the core's fast path, or the mix reports lie.
    #[test]
    fn table1_flag_matches_the_fast_path() {
        let all = [
            (SegmentKind::Syn, SYN_MIX),
            (SegmentKind::SynAck, SYN_ACK_MIX),
            (SegmentKind::Other, ESTABLISHED_MIX),
        ];
        for (segment, mix) in all {
            for &(layout, _) in mix {
                let bytes = layout.options(0x1234_5678, 0x9abc_def0);
                assert_eq!(bytes.len() % 4, 0, "{layout:?} not padded");
                let found = find_timestamp(&bytes, segment).unwrap();
                assert_eq!(found.fast_path, layout.is_table1(), "{layout:?}");
                assert!(found.offset.is_some(), "{layout:?}");
            }
        }
        let none = find_timestamp(&Layout::WindowsSyn.options(0, 0), SegmentKind::Syn).unwrap();
        assert_eq!(none.offset, None);
    }
}
