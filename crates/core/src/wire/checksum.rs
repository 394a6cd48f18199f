//! Internet checksum arithmetic (RFC 1071) and its incremental update (RFC 1624).
//!
//! Every header rewrite in cheetah goes through this module's incremental updates: the L4
//! checksum is never recomputed or verified, so a packet that arrived with a bad checksum
//! leaves with a checksum that is exactly as bad, and the receiver drops it as it would
//! have without us.

/// Ones'-complement sum of `data` taken as big-endian 16-bit words, not folded.
///
/// An odd trailing byte is padded with zero, as RFC 1071 does at the end of a message.
#[inline]
pub fn sum(data: &[u8]) -> u32 {
    let mut acc: u32 = 0;
    let mut words = data.chunks_exact(2);
    for word in &mut words {
        acc += u16::from_be_bytes([word[0], word[1]]) as u32;
    }
    if let [last] = words.remainder() {
        acc += (*last as u32) << 8;
    }
    acc
}

/// Folds a 32-bit ones'-complement accumulator into 16 bits.
#[inline]
pub fn fold(acc: u32) -> u16 {
    // One end-around carry: when the halves overflow 16 bits their sum is at most 0xfffe,
    // so adding the carry back cannot overflow again.
    let (sum, carry) = (acc as u16).overflowing_add((acc >> 16) as u16);
    sum + carry as u16
}

/// The checksum field value for a region whose ones'-complement sum is `acc`.
#[inline]
pub fn finish(acc: u32) -> u16 {
    !fold(acc)
}

/// Full checksum of `data` (used to build packets and to check rewrites in tests).
pub fn compute(data: &[u8]) -> u16 {
    finish(sum(data))
}

/// RFC 1624 eqn. 3: the new checksum after the bytes `old` at some position in the
/// checksummed region became `new` (same length).
///
/// `odd_offset` says whether that position is at an odd byte offset from the start of the
/// region. Ones'-complement sums commute with byte swapping, so a field that straddles
/// 16-bit words is summed as if aligned and its partial sum byte-swapped before it is
/// folded in. Only parity matters: a multiple of 2 added to an offset changes nothing.
#[inline]
pub fn update(checksum: u16, odd_offset: bool, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    // ~old + new, word by word; `!word` is the ones' complement of each 16-bit word.
    let mut delta: u32 = 0;
    let mut old_words = old.chunks_exact(2);
    let mut new_words = new.chunks_exact(2);
    for (o, n) in (&mut old_words).zip(&mut new_words) {
        delta += !u16::from_be_bytes([o[0], o[1]]) as u32;
        delta += u16::from_be_bytes([n[0], n[1]]) as u32;
    }
    if let ([o], [n]) = (old_words.remainder(), new_words.remainder()) {
        delta += !((*o as u16) << 8) as u32;
        // The zero pad byte of `old` complements to 0xff, which is exactly what makes
        // ~old + new equal new - old in ones'-complement arithmetic; nothing to cancel.
        delta += ((*n as u16) << 8) as u32;
    }
    let mut delta = fold(delta);
    if odd_offset {
        delta = delta.swap_bytes();
    }
    !fold((!checksum) as u32 + delta as u32)
}

/// [`update`] for one 16-bit field at an even offset.
#[inline]
pub fn update_u16(checksum: u16, old: u16, new: u16) -> u16 {
    !fold((!checksum) as u32 + (!old) as u32 + new as u32)
}

/// [`update`] for one 32-bit field at an even offset (e.g. an IPv4 address).
#[inline]
pub fn update_u32(checksum: u16, old: u32, new: u32) -> u16 {
    let acc = (!checksum) as u32
        + (!(old >> 16) as u16) as u32
        + (!(old as u16)) as u32
        + (new >> 16)
        + (new & 0xffff);
    !fold(acc)
}

/// [`update`] for one 32-bit field at any offset, without the byte loop: the hot path
/// rewrites TSval and TSecr this way, and the option walk may put them at odd offsets.
#[inline]
pub fn update_u32_at(checksum: u16, odd_offset: bool, old: u32, new: u32) -> u16 {
    if !odd_offset {
        return update_u32(checksum, old, new);
    }
    let delta =
        fold((!(old >> 16) as u16) as u32 + (!(old as u16)) as u32 + (new >> 16) + (new & 0xffff));
    !fold((!checksum) as u32 + delta.swap_bytes() as u32)
}

/// Replaces the high 16 bits of the big-endian 32-bit word at `word_at` in `buf` with
/// `new_high` (the low half stays) and updates the checksum at `checksum_at`: the same
/// bytes as writing the whole word and folding in [`update_u32_at`], which the general
/// path does, for a word at an even offset from the start of the checksummed region.
/// Nothing at all is written when the half is unchanged (eqn. 3 would turn a 0xffff
/// checksum into 0). The straight-line paths rewrite TSval's and TSecr's cookie half this
/// way.
///
/// Ones'-complement sums commute with swapping the bytes of every word (RFC 1071 2.B),
/// so the words are summed as they lie in memory, with no byte swaps but the one that
/// puts `new_high` in network order.
#[inline(always)]
pub fn replace_high_half(buf: &mut [u8], word_at: usize, checksum_at: usize, new_high: u16) {
    replace_high_half_in_network_order(buf, word_at, checksum_at, new_high.to_be());
}

/// [`replace_high_half`] with the new half already in network byte order (`new_high.to_be()`),
/// as the MSB table keeps restored MSBs, so that the client path swaps no bytes at all.
#[inline(always)]
pub fn replace_high_half_in_network_order(
    buf: &mut [u8],
    word_at: usize,
    checksum_at: usize,
    new: u16,
) {
    let old = read_u16_in_memory_order(buf, word_at);
    if old == new {
        return;
    }
    write_u16_in_memory_order(buf, word_at, new);
    let sum = read_u16_in_memory_order(buf, checksum_at);
    // ~sum + ~old + new + ~low + low, with each ~x of a 16-bit word written 0xffff - x.
    let acc = 0x2_fffd + new as u32 - sum as u32 - old as u32;
    write_u16_in_memory_order(buf, checksum_at, finish(acc));
}

#[inline(always)]
fn read_u16_in_memory_order(buf: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(buf[at..at + 2].try_into().unwrap())
}

#[inline(always)]
fn write_u16_in_memory_order(buf: &mut [u8], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc1071_example_sums_to_known_value() {
        // RFC 1071 section 3 example bytes.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
    }

    #[test]
    fn ipv4_header_checksum_matches_known_header() {
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(compute(&header), 0xb861);
    }

    fn with_checksum(mut region: Vec<u8>, at: usize) -> Vec<u8> {
        region[at] = 0;
        region[at + 1] = 0;
        let c = compute(&region);
        region[at..at + 2].copy_from_slice(&c.to_be_bytes());
        region
    }

    fn fold_until_it_fits(mut acc: u32) -> u16 {
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    #[test]
    fn fold_edges() {
        for acc in [
            0,
            1,
            0xffff,
            0x1_0000,
            0x1_fffe,
            0x1_ffff,
            0xffff_0001,
            0xffff_ffff,
        ] {
            assert_eq!(fold(acc), fold_until_it_fits(acc), "{acc:#x}");
        }
        assert_eq!(fold(0x1_fffe), 0xffff);
        assert_eq!(fold(0xffff_ffff), 0xffff);
    }

    proptest! {
        /// Rewriting any bytes at any offset (odd or even) and updating incrementally gives
        /// the same checksum as recomputing from scratch.
        #[test]
        fn incremental_update_equals_recompute(
            region in proptest::collection::vec(any::<u8>(), 8..80),
            at in 0usize..64,
            replacement in proptest::collection::vec(any::<u8>(), 1..9),
        ) {
            let region = with_checksum(region, 0);
            let at = 2 + at % (region.len() - 2);
            let len = replacement.len().min(region.len() - at);
            let replacement = &replacement[..len];
            let old_sum = u16::from_be_bytes([region[0], region[1]]);
            let mut rewritten = region.clone();
            rewritten[at..at + len].copy_from_slice(replacement);
            let updated = update(old_sum, at % 2 == 1, &region[at..at + len], replacement);
            let mut expected = rewritten.clone();
            expected[0] = 0;
            expected[1] = 0;
            // Both are valid encodings of the same sum; compare as folded sums of the whole.
            rewritten[0..2].copy_from_slice(&updated.to_be_bytes());
            prop_assert_eq!(fold(sum(&rewritten)), 0xffff, "updated checksum must verify");
        }

        /// A checksum that was wrong before a rewrite is wrong by exactly the same amount after.
        #[test]
        fn bad_checksum_stays_exactly_as_bad(
            region in proptest::collection::vec(any::<u8>(), 8..40),
            error in 1u16..=0xfffe,
            new_word in any::<u32>(),
        ) {
            let good = with_checksum(region, 0);
            let good_sum = u16::from_be_bytes([good[0], good[1]]);
            let bad_sum = good_sum.wrapping_add(error);
            prop_assume!(bad_sum != good_sum && !(good_sum == 0 && bad_sum == 0xffff) && !(good_sum == 0xffff && bad_sum == 0));
            let at = 4.min(good.len() - 4);
            let old = good[at..at + 4].to_vec();
            let new = new_word.to_be_bytes();
            let good_after = update(good_sum, false, &old, &new);
            let bad_after = update(bad_sum, false, &old, &new);
            prop_assert_eq!(
                fold((!good_after) as u32 + bad_after as u32),
                fold((!good_sum) as u32 + bad_sum as u32)
            );
        }

        /// The one-carry fold is RFC 1071's fold-until-it-fits.
        #[test]
        fn fold_equals_folding_until_it_fits(acc in any::<u32>()) {
            prop_assert_eq!(fold(acc), fold_until_it_fits(acc));
        }

        #[test]
        fn replacing_the_high_half_equals_rewriting_the_word(
            region in proptest::collection::vec(any::<u8>(), 8..40),
            word_pair in 0usize..20,
            checksum_pair in 0usize..20,
            new_high in any::<u16>(),
            same in any::<bool>(),
        ) {
            let pairs = region.len() / 2;
            let word_at = (word_pair % (pairs - 1)) * 2;
            let mut checksum_at = (checksum_pair % pairs) * 2;
            if checksum_at == word_at || checksum_at == word_at + 2 {
                checksum_at = if word_at >= 2 { word_at - 2 } else { word_at + 4 };
            }
            prop_assume!(checksum_at + 2 <= region.len());
            let old = u32::from_be_bytes(region[word_at..word_at + 4].try_into().unwrap());
            let new_high = if same { (old >> 16) as u16 } else { new_high };
            let new = (new_high as u32) << 16 | (old & 0xffff);

            let mut fast = region.clone();
            replace_high_half(&mut fast, word_at, checksum_at, new_high);

            let mut general = region.clone();
            if old != new {
                general[word_at..word_at + 4].copy_from_slice(&new.to_be_bytes());
                let checksum = u16::from_be_bytes([region[checksum_at], region[checksum_at + 1]]);
                let updated = update_u32_at(checksum, false, old, new);
                general[checksum_at..checksum_at + 2].copy_from_slice(&updated.to_be_bytes());
            }
            prop_assert_eq!(fast, general);
        }

        #[test]
        fn word_helpers_equal_byte_update(csum in any::<u16>(), old in any::<u32>(), new in any::<u32>()) {
            let via_bytes = update(csum, false, &old.to_be_bytes(), &new.to_be_bytes());
            prop_assert_eq!(fold(update_u32(csum, old, new) as u32), fold(via_bytes as u32));
            let via_bytes_odd = update(csum, true, &old.to_be_bytes(), &new.to_be_bytes());
            prop_assert_eq!(fold(update_u32_at(csum, true, old, new) as u32), fold(via_bytes_odd as u32));
            prop_assert_eq!(update_u32_at(csum, false, old, new), update_u32(csum, old, new));
            let via_bytes16 = update(csum, false, &(old as u16).to_be_bytes(), &(new as u16).to_be_bytes());
            prop_assert_eq!(update_u16(csum, old as u16, new as u16), via_bytes16);
        }
    }
}
