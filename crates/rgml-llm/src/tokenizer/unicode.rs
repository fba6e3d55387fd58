//! Unicode helpers the tokenizers share: the code point classes the pre-tokenizers test
//! (letter, mark, number, whitespace, assigned) and GPT-2's byte <-> printable-char mapping.
//!
//! The classes are those of Unicode 15.1, the version of llama.cpp's tables: the general
//! category comes from the `unicode-general-category` crate (Unicode 16.0) except for the
//! code points 16.0 added, which read as unassigned ([`general_category`]).

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// Code points Unicode 16.0 assigns and 15.1 does not, first and last of each range
/// (made by scripts/gen_unicode_delta.py).
const NEW_IN_UNICODE_16: &[(u32, u32)] = &[
    (0x00897, 0x00897),
    (0x01B4E, 0x01B4F),
    (0x01B7F, 0x01B7F),
    (0x01C89, 0x01C8A),
    (0x02427, 0x02429),
    (0x031E4, 0x031E5),
    (0x0A7CB, 0x0A7CD),
    (0x0A7DA, 0x0A7DC),
    (0x105C0, 0x105F3),
    (0x10D40, 0x10D65),
    (0x10D69, 0x10D85),
    (0x10D8E, 0x10D8F),
    (0x10EC2, 0x10EC4),
    (0x10EFC, 0x10EFC),
    (0x11380, 0x11389),
    (0x1138B, 0x1138B),
    (0x1138E, 0x1138E),
    (0x11390, 0x113B5),
    (0x113B7, 0x113C0),
    (0x113C2, 0x113C2),
    (0x113C5, 0x113C5),
    (0x113C7, 0x113CA),
    (0x113CC, 0x113D5),
    (0x113D7, 0x113D8),
    (0x113E1, 0x113E2),
    (0x116D0, 0x116E3),
    (0x11BC0, 0x11BE1),
    (0x11BF0, 0x11BF9),
    (0x11F5A, 0x11F5A),
    (0x13460, 0x143FA),
    (0x16100, 0x16139),
    (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF),
    (0x1CC00, 0x1CCF9),
    (0x1CD00, 0x1CEB3),
    (0x1E5D0, 0x1E5FA),
    (0x1E5FF, 0x1E5FF),
    (0x1F8B2, 0x1F8BB),
    (0x1F8C0, 0x1F8C1),
    (0x1FA89, 0x1FA89),
    (0x1FA8F, 0x1FA8F),
    (0x1FABE, 0x1FABE),
    (0x1FAC6, 0x1FAC6),
    (0x1FADC, 0x1FADC),
    (0x1FADF, 0x1FADF),
    (0x1FAE9, 0x1FAE9),
    (0x1FBCB, 0x1FBEF),
];

/// The general category of `c` in Unicode 15.1: the crate's, or unassigned for a code point
/// Unicode 16.0 added.
pub(crate) fn general_category(c: char) -> Gc {
    let cp = c as u32;
    let new = NEW_IN_UNICODE_16
        .binary_search_by(|&(first, last)| {
            if last < cp {
                std::cmp::Ordering::Less
            } else if first > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok();
    if new {
        Gc::Unassigned
    } else {
        get_general_category(c)
    }
}

/// The classes of a code point that the pre-tokenizers look at, as llama.cpp's
/// `unicode_cpt_flags` does: `letter` is general category L*, `mark` is M* (llama.cpp's
/// `is_accent_mark`, `\p{M}`), `number` is N*, `whitespace`
/// is the Unicode `White_Space` property, and `present` is true for every code point and false
/// only for [`CpFlags::NONE`], the flags of a position past the end of a fragment. (llama.cpp
/// gives unassigned code points a non-zero UNDEFINED flag, so they count as present and as
/// `[^\s\p{L}\p{N}]`, as in a regex engine.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpFlags {
    pub letter: bool,
    pub mark: bool,
    pub number: bool,
    pub whitespace: bool,
    pub present: bool,
}

impl CpFlags {
    /// Flags for a position past the end of a fragment: nothing matches there.
    pub const NONE: CpFlags = CpFlags {
        letter: false,
        mark: false,
        number: false,
        whitespace: false,
        present: false,
    };

    /// Neither whitespace, letter nor number, but present: the `[^\s\p{L}\p{N}]` class as
    /// llama.cpp's custom splitters test it.
    #[inline]
    pub fn is_other(self) -> bool {
        self.present && !(self.whitespace || self.letter || self.number)
    }
}

/// Classifies `c`. ASCII goes through a fast path because it is nearly all of real text.
#[inline]
pub(crate) fn flags(c: char) -> CpFlags {
    if c.is_ascii() {
        let b = c as u8;
        return CpFlags {
            letter: b.is_ascii_alphabetic(),
            mark: false,
            number: b.is_ascii_digit(),
            // \t \n \v \f \r and space: the ASCII part of White_Space.
            whitespace: matches!(b, 9..=13 | 32),
            present: true,
        };
    }
    let cat = general_category(c);
    CpFlags {
        letter: matches!(
            cat,
            Gc::UppercaseLetter
                | Gc::LowercaseLetter
                | Gc::TitlecaseLetter
                | Gc::ModifierLetter
                | Gc::OtherLetter
        ),
        mark: matches!(
            cat,
            Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark
        ),
        number: matches!(cat, Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber),
        // std's is_whitespace is exactly the White_Space property, the set llama.cpp uses.
        whitespace: c.is_whitespace(),
        present: true,
    }
}

/// GPT-2's byte-to-char table: printable Latin-1 bytes map to themselves, the other 68 bytes
/// to U+0100.. in byte order, so every byte sequence becomes a printable string.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            let cp = next;
            next += 1;
            cp
        };
        // Every value here is below U+0144, always a valid scalar value.
        *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char_table`]: the byte a char of a byte-level BPE token stands
/// for, or `None` for a char outside the table.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            // The n-th non-printable byte maps to U+0100 + n.
            let n = (cp - 0x100) as usize;
            NON_PRINTABLE.get(n).copied()
        }
        _ => None,
    }
}

/// The 68 bytes GPT-2 remaps, in order.
const NON_PRINTABLE: [u8; 68] = {
    let mut out = [0u8; 68];
    let mut i = 0;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if !printable {
            out[i] = b as u8;
            i += 1;
        }
        b += 1;
    }
    out
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips() {
        let t = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn unicode_version_of_the_tables() {
        // NEW_IN_UNICODE_16 is the difference between the crate's tables and llama.cpp's;
        // a crate of another Unicode version needs it made again (scripts/gen_unicode_delta.py).
        assert_eq!(unicode_general_category::UNICODE_VERSION, (16, 0, 0));
        assert!(NEW_IN_UNICODE_16.windows(2).all(|w| w[0].1 < w[1].0));
        // U+135AD, an Egyptian hieroglyph of Unicode 16.0, is no letter to llama.cpp.
        assert_eq!(general_category('\u{135AD}'), Gc::Unassigned);
        assert!(flags('\u{135AD}').is_other());
        assert_eq!(general_category('\u{1F000}'), Gc::OtherSymbol);
        assert_eq!(general_category('日'), Gc::OtherLetter);
    }

    #[test]
    fn classes() {
        assert!(flags('é').letter);
        assert!(flags('٣').number);
        assert!(flags('\u{3000}').whitespace);
        assert!(flags('🚀').is_other());
        // Unassigned code points are "other", as llama.cpp's UNDEFINED flag makes them.
        assert!(flags('\u{0378}').is_other());
        assert!(!CpFlags::NONE.is_other());
        // A combining mark is neither letter nor number: "other" to GPT-2's and Llama 3's
        // classes, a class of its own to Qwen 3.5's.
        assert!(flags('\u{0301}').is_other() && flags('\u{0301}').mark);
        assert!(flags('\u{0903}').mark && flags('\u{20DD}').mark && !flags('a').mark);
    }
}
