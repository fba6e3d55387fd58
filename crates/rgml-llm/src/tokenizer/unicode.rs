//! Unicode helpers the tokenizers share: the code point classes the pre-tokenizers test
//! (letter, number, whitespace, assigned) and GPT-2's byte <-> printable-char mapping.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// The classes of a code point that the pre-tokenizers look at, as llama.cpp's
/// `unicode_cpt_flags` does: `letter` is general category L*, `number` is N*, `whitespace`
/// is the Unicode `White_Space` property, and `present` is true for every code point and false
/// only for [`CpFlags::NONE`], the flags of a position past the end of a fragment. (llama.cpp
/// gives unassigned code points a non-zero UNDEFINED flag, so they count as present and as
/// `[^\s\p{L}\p{N}]`, as in a regex engine.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpFlags {
    pub letter: bool,
    pub number: bool,
    pub whitespace: bool,
    pub present: bool,
}

impl CpFlags {
    /// Flags for a position past the end of a fragment: nothing matches there.
    pub const NONE: CpFlags = CpFlags {
        letter: false,
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
            number: b.is_ascii_digit(),
            // \t \n \v \f \r and space: the ASCII part of White_Space.
            whitespace: matches!(b, 9..=13 | 32),
            present: true,
        };
    }
    let cat = get_general_category(c);
    CpFlags {
        letter: matches!(
            cat,
            Gc::UppercaseLetter
                | Gc::LowercaseLetter
                | Gc::TitlecaseLetter
                | Gc::ModifierLetter
                | Gc::OtherLetter
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
    fn classes() {
        assert!(flags('é').letter);
        assert!(flags('٣').number);
        assert!(flags('\u{3000}').whitespace);
        assert!(flags('🚀').is_other());
        // Unassigned code points are "other", as llama.cpp's UNDEFINED flag makes them.
        assert!(flags('\u{0378}').is_other());
        assert!(!CpFlags::NONE.is_other());
        assert!(flags('\u{0301}').is_other());
    }
}
