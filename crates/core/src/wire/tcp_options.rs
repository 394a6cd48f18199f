//! Finding the TCP timestamp option, fast.
//!
//! Options are a TLV chain in any order, so the general walk is branchy. The paper's
//! Table 1 (798M packets from a campus trace) shows that almost every packet uses one of a
//! handful of layouts; each is checked here with one masked wide compare (32 bits for
//! non-SYN packets, 64 or 128 bits for SYN and SYN-ACK) and only the rest take the TLV walk.
//! Both paths return the same answer for every input (property-tested): every fixed byte of
//! a pattern, including each option's length byte, is one the walk would check.
//!
//! The walk stops at the first timestamp option: options after it are not inspected, as
//! the LB needs nothing from them and the server's own stack validates them.

use crate::verdict::DropReason;

pub mod kind {
    pub const END: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMP: u8 = 8;
}

/// Length of the timestamp option: kind, length, TSval, TSecr.
pub const TIMESTAMP_LEN: usize = 10;
/// TSval offset from the start of the timestamp option.
pub const TSVAL: usize = 2;
/// TSecr offset from the start of the timestamp option.
pub const TSECR: usize = 6;

/// Which Table 1 row set applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    Syn,
    SynAck,
    Other,
}

impl SegmentKind {
    #[inline]
    pub fn from_flags(flags: u8) -> Self {
        use super::tcp::flags::{ACK, SYN};
        match (flags & SYN != 0, flags & ACK != 0) {
            (true, false) => SegmentKind::Syn,
            (true, true) => SegmentKind::SynAck,
            _ => SegmentKind::Other,
        }
    }
}

/// A layout with wildcards: `value` and `mask` are the option bytes in wire order, loaded
/// little-endian so that byte `i` of the options is bits `8i..8i+8`.
struct Pattern<W> {
    value: W,
    mask: W,
    timestamp_at: usize,
}

const fn pattern64(bytes: [i16; 8], timestamp_at: usize) -> Pattern<u64> {
    let (mut value, mut mask, mut i) = (0u64, 0u64, 0);
    while i < 8 {
        if bytes[i] >= 0 {
            value |= (bytes[i] as u64) << (8 * i);
            mask |= 0xff << (8 * i);
        }
        i += 1;
    }
    Pattern {
        value,
        mask,
        timestamp_at,
    }
}

const fn pattern128(bytes: [i16; 12], timestamp_at: usize) -> Pattern<u128> {
    let (mut value, mut mask, mut i) = (0u128, 0u128, 0);
    while i < 12 {
        if bytes[i] >= 0 {
            value |= (bytes[i] as u128) << (8 * i);
            mask |= 0xff << (8 * i);
        }
        i += 1;
    }
    Pattern {
        value,
        mask,
        timestamp_at,
    }
}

const ANY: i16 = -1;
use kind::{MSS, NOP, SACK_PERMITTED as SACK_OK, TIMESTAMP as TS, WINDOW_SCALE as WS};

/// MSS SAckOK Timestamp [NOP WScale] (Linux SYN and SYN-ACK).
const MSS_SACKOK_TS: Pattern<u64> = pattern64(
    [MSS as i16, 4, ANY, ANY, SACK_OK as i16, 2, TS as i16, 10],
    6,
);
/// MSS NOP NOP Timestamp [SAckOK EOL].
const MSS_NOP_NOP_TS: Pattern<u64> = pattern64(
    [
        MSS as i16, 4, ANY, ANY, NOP as i16, NOP as i16, TS as i16, 10,
    ],
    6,
);
/// MSS NOP WScale NOP NOP Timestamp [SAckOK EOL] (macOS / iOS SYN).
const MSS_NOP_WS_NOP_NOP_TS: Pattern<u128> = pattern128(
    [
        MSS as i16, 4, ANY, ANY, NOP as i16, WS as i16, 3, ANY, NOP as i16, NOP as i16, TS as i16,
        10,
    ],
    10,
);
/// MSS NOP WScale SAckOK Timestamp.
const MSS_NOP_WS_SACKOK_TS: Pattern<u128> = pattern128(
    [
        MSS as i16,
        4,
        ANY,
        ANY,
        NOP as i16,
        WS as i16,
        3,
        ANY,
        SACK_OK as i16,
        2,
        TS as i16,
        10,
    ],
    10,
);
/// NOP NOP Timestamp: 99.95% of non-SYN packets.
const NOP_NOP_TS: u32 = u32::from_le_bytes([NOP, NOP, TS, 10]);

#[inline]
fn matches64(options: &[u8], p: &Pattern<u64>) -> bool {
    options.len() >= p.timestamp_at + TIMESTAMP_LEN
        && u64::from_le_bytes(options[..8].try_into().unwrap()) & p.mask == p.value
}

#[inline]
fn matches128(options: &[u8], p: &Pattern<u128>) -> bool {
    options.len() >= p.timestamp_at + TIMESTAMP_LEN
        && u128::from_le_bytes(options[..16].try_into().unwrap()) & p.mask == p.value
}

/// The paper's fast path: the offset of the timestamp option within `options` if the
/// layout is one of Table 1's, `None` if the slow path must decide.
#[inline]
pub fn find_timestamp_fast(options: &[u8], segment: SegmentKind) -> Option<usize> {
    match segment {
        SegmentKind::Other => (options.len() >= 2 + TIMESTAMP_LEN
            && u32::from_le_bytes(options[..4].try_into().unwrap()) == NOP_NOP_TS)
            .then_some(2),
        SegmentKind::Syn | SegmentKind::SynAck => {
            if matches64(options, &MSS_SACKOK_TS) {
                Some(MSS_SACKOK_TS.timestamp_at)
            } else if matches128(options, &MSS_NOP_WS_NOP_NOP_TS) {
                Some(MSS_NOP_WS_NOP_NOP_TS.timestamp_at)
            } else if matches128(options, &MSS_NOP_WS_SACKOK_TS) {
                Some(MSS_NOP_WS_SACKOK_TS.timestamp_at)
            } else if matches64(options, &MSS_NOP_NOP_TS) {
                Some(MSS_NOP_NOP_TS.timestamp_at)
            } else {
                None
            }
        }
    }
}

/// The TLV walk: the offset of the first timestamp option, `None` if there is none, or the
/// reason the options are malformed.
pub fn find_timestamp_slow(options: &[u8]) -> Result<Option<usize>, DropReason> {
    let mut at = 0;
    while at < options.len() {
        match options[at] {
            kind::END => return Ok(None),
            kind::NOP => at += 1,
            option => {
                let Some(&len) = options.get(at + 1) else {
                    return Err(DropReason::TcpOptionTruncated);
                };
                let len = len as usize;
                if len < 2 {
                    return Err(DropReason::TcpOptionBadLength);
                }
                if at + len > options.len() {
                    return Err(DropReason::TcpOptionOverrun);
                }
                if option == kind::TIMESTAMP {
                    if len != TIMESTAMP_LEN {
                        return Err(DropReason::BadTimestampOptionLength);
                    }
                    return Ok(Some(at));
                }
                at += len;
            }
        }
    }
    Ok(None)
}

/// Where the timestamp option is, and which path found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimestampLookup {
    pub offset: Option<usize>,
    pub fast_path: bool,
}

/// Fast path first, TLV walk for the rest.
#[inline]
pub fn find_timestamp(options: &[u8], segment: SegmentKind) -> Result<TimestampLookup, DropReason> {
    match find_timestamp_fast(options, segment) {
        Some(offset) => Ok(TimestampLookup {
            offset: Some(offset),
            fast_path: true,
        }),
        None => find_timestamp_slow(options).map(|offset| TimestampLookup {
            offset,
            fast_path: false,
        }),
    }
}

#[inline]
pub fn tsval(options: &[u8], timestamp_at: usize) -> u32 {
    super::read_u32(options, timestamp_at + TSVAL)
}

#[inline]
pub fn tsecr(options: &[u8], timestamp_at: usize) -> u32 {
    super::read_u32(options, timestamp_at + TSECR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TS_BODY: [u8; 8] = [0, 0, 0, 7, 0, 0, 0, 9];

    fn ts() -> Vec<u8> {
        let mut v = vec![TS, 10];
        v.extend_from_slice(&TS_BODY);
        v
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    const MSS_OPT: &[u8] = &[MSS, 4, 0x05, 0xb4];
    const SACK_OK_OPT: &[u8] = &[SACK_OK, 2];
    const WS_OPT: &[u8] = &[WS, 3, 7];
    const NOPS: &[u8] = &[NOP, NOP];

    /// Every row of the paper's Table 1, with the segment kind it was measured on.
    fn table1() -> Vec<(SegmentKind, Vec<u8>, usize)> {
        vec![
            (
                SegmentKind::Syn,
                cat(&[MSS_OPT, SACK_OK_OPT, &ts(), &[NOP], WS_OPT]),
                6,
            ),
            (
                SegmentKind::Syn,
                cat(&[MSS_OPT, &[NOP], WS_OPT, NOPS, &ts(), SACK_OK_OPT, &[0, 0]]),
                10,
            ),
            (
                SegmentKind::Syn,
                cat(&[MSS_OPT, &[NOP], WS_OPT, SACK_OK_OPT, &ts()]),
                10,
            ),
            (
                SegmentKind::SynAck,
                cat(&[MSS_OPT, SACK_OK_OPT, &ts(), &[NOP], WS_OPT]),
                6,
            ),
            (
                SegmentKind::SynAck,
                cat(&[MSS_OPT, &[NOP], WS_OPT, SACK_OK_OPT, &ts()]),
                10,
            ),
            (
                SegmentKind::SynAck,
                cat(&[MSS_OPT, NOPS, &ts(), SACK_OK_OPT, &[0, 0]]),
                6,
            ),
            (
                SegmentKind::SynAck,
                cat(&[MSS_OPT, &[NOP], WS_OPT, NOPS, &ts(), SACK_OK_OPT, &[0, 0]]),
                10,
            ),
            (SegmentKind::Other, cat(&[NOPS, &ts()]), 2),
            (
                SegmentKind::Other,
                cat(&[NOPS, &ts(), NOPS, &[kind::SACK, 10], &[0; 8]]),
                2,
            ),
        ]
    }

    #[test]
    fn every_table1_layout_takes_the_fast_path() {
        for (segment, options, at) in table1() {
            assert_eq!(
                find_timestamp_fast(&options, segment),
                Some(at),
                "{segment:?} {options:?}"
            );
            assert_eq!(find_timestamp_slow(&options), Ok(Some(at)));
            assert_eq!(tsval(&options, at), 7);
            assert_eq!(tsecr(&options, at), 9);
        }
    }

    #[test]
    fn other_layouts_fall_back_to_the_walk() {
        // Windows-style SYN: MSS NOP WS NOP NOP SAckOK, no timestamp.
        let windows = cat(&[MSS_OPT, &[NOP], WS_OPT, NOPS, SACK_OK_OPT]);
        assert_eq!(
            find_timestamp(&windows, SegmentKind::Syn),
            Ok(TimestampLookup {
                offset: None,
                fast_path: false
            })
        );
        // Timestamp first, no NOPs.
        let ts_first = cat(&[&ts(), NOPS]);
        assert_eq!(
            find_timestamp(&ts_first, SegmentKind::Other),
            Ok(TimestampLookup {
                offset: Some(0),
                fast_path: false
            })
        );
        // Timestamp after a SACK block on an ACK.
        let after_sack = cat(&[NOPS, &[kind::SACK, 10], &[0; 8], NOPS, &ts()]);
        assert_eq!(
            find_timestamp(&after_sack, SegmentKind::Other)
                .unwrap()
                .offset,
            Some(14)
        );
    }

    #[test]
    fn malformed_options_get_typed_reasons() {
        assert_eq!(
            find_timestamp_slow(&[MSS]),
            Err(DropReason::TcpOptionTruncated)
        );
        assert_eq!(
            find_timestamp_slow(&[MSS, 0, 0, 0]),
            Err(DropReason::TcpOptionBadLength)
        );
        assert_eq!(
            find_timestamp_slow(&[MSS, 1, 0, 0]),
            Err(DropReason::TcpOptionBadLength)
        );
        assert_eq!(
            find_timestamp_slow(&[MSS, 8, 0, 0]),
            Err(DropReason::TcpOptionOverrun)
        );
        assert_eq!(
            find_timestamp_slow(&[TS, 8, 0, 0, 0, 0, 0, 0]),
            Err(DropReason::BadTimestampOptionLength)
        );
        assert_eq!(
            find_timestamp_slow(&[NOP, NOP, TS, 10, 0, 0, 0]),
            Err(DropReason::TcpOptionOverrun)
        );
    }

    #[test]
    fn end_of_list_stops_the_walk() {
        assert_eq!(find_timestamp_slow(&cat(&[&[0, 0], &ts()])), Ok(None));
    }

    #[test]
    fn truncated_pattern_is_not_a_fast_path_hit() {
        let mut short = cat(&[NOPS, &ts()]);
        short.truncate(11);
        assert_eq!(find_timestamp_fast(&short, SegmentKind::Other), None);
        assert_eq!(
            find_timestamp_slow(&short),
            Err(DropReason::TcpOptionOverrun)
        );
    }

    fn option_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(vec![NOP]),
            Just(vec![0]),
            Just(MSS_OPT.to_vec()),
            Just(SACK_OK_OPT.to_vec()),
            Just(WS_OPT.to_vec()),
            any::<[u8; 8]>().prop_map(|body| cat(&[&[TS, 10], &body])),
            (any::<u8>(), 0u8..12).prop_map(|(k, l)| vec![k, l]),
            proptest::collection::vec(any::<u8>(), 0..6),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// The fast path never disagrees with the walk, for any bytes and any segment kind.
        #[test]
        fn fast_path_equals_slow_path(
            parts in proptest::collection::vec(option_strategy(), 0..8),
            segment in prop_oneof![Just(SegmentKind::Syn), Just(SegmentKind::SynAck), Just(SegmentKind::Other)],
            cut in 0usize..48,
        ) {
            let mut options = parts.concat();
            options.truncate(cut.max(options.len().min(40)));
            options.truncate(40);
            let slow = find_timestamp_slow(&options);
            if let Some(at) = find_timestamp_fast(&options, segment) {
                prop_assert_eq!(slow, Ok(Some(at)));
            }
            prop_assert_eq!(find_timestamp(&options, segment).map(|l| l.offset), slow);
        }

        #[test]
        fn walk_never_panics_on_any_bytes(options in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = find_timestamp(&options, SegmentKind::Other);
            let _ = find_timestamp(&options, SegmentKind::Syn);
        }
    }
}
