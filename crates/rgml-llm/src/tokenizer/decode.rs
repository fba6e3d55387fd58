//! Detokenization: streaming, where token pieces can end inside a UTF-8 character, so the
//! [`Decoder`] holds back an incomplete tail until the next token completes it; and the
//! clean-up llama.cpp applies to a whole detokenized text for some BPE vocabularies.

use super::{TokenId, Tokenizer};
use crate::error::Result;

/// Turns a stream of token ids into text as it arrives, piece by piece as llama.cpp's
/// `llama_token_to_piece` gives them. The concatenation of everything [`Decoder::push`] and
/// [`Decoder::finish`] return equals [`Tokenizer::decode`] of the whole sequence, including
/// U+FFFD for invalid bytes, except that `decode` also applies the space clean-up some BPE
/// vocabularies ask for (as llama.cpp's `llama_detokenize` does and its streaming does not).
#[derive(Clone, Debug)]
pub struct Decoder<'t> {
    tok: &'t Tokenizer,
    special: bool,
    /// Special tokens rendered even without `special` (a format's markers).
    preserved: Vec<TokenId>,
    index: usize,
    pending: Vec<u8>,
}

impl<'t> Decoder<'t> {
    pub(crate) fn new(tok: &'t Tokenizer, special: bool, preserved: Vec<TokenId>) -> Decoder<'t> {
        Decoder {
            tok,
            special,
            preserved,
            index: 0,
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text that is now complete (possibly empty). Errors on
    /// an id outside the vocabulary, leaving the decoder as it was.
    pub fn push(&mut self, id: TokenId) -> Result<String> {
        let special = self.special || self.preserved.contains(&id);
        let piece = self.tok.piece_at(self.index, id, special)?;
        self.index += 1;
        self.pending.extend_from_slice(piece);
        Ok(self.take(false))
    }

    /// Ends the stream: returns what is still held back (an incomplete character becomes
    /// U+FFFD) and resets the decoder for a new sequence.
    pub fn finish(&mut self) -> String {
        let s = self.take(true);
        self.index = 0;
        s
    }

    /// Moves every byte that is settled out of `pending`: valid UTF-8, and invalid sequences
    /// (as U+FFFD, as `String::from_utf8_lossy` does); keeps an incomplete tail unless `all`.
    fn take(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe split: `valid` bytes were just validated.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            consumed += valid + bad;
                        }
                        None => {
                            // An incomplete character at the end: wait for more bytes.
                            consumed += valid;
                            if all {
                                out.push('\u{FFFD}');
                                consumed = self.pending.len();
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}

/// llama.cpp's `clean_spaces` clean-up of a detokenized text, three passes in its order: a
/// space before `?`, `!`, `.` or `,` goes; a quote between two spaces loses both; a space
/// before `'s`, `'m`, `'re` or `'ve` goes. Each pass tests the characters as they were before
/// it, as llama.cpp's in-place passes do.
pub(crate) fn clean_spaces(text: &[u8]) -> Vec<u8> {
    contractions(&quote_between_spaces(&space_before_punct(text)))
}

fn space_before_punct(t: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    out
}

fn quote_between_spaces(t: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.len());
    // The character before the current one as llama.cpp sees it: after a removal it has
    // overwritten the dropped space that follows the quote with a NUL.
    let mut prev = None;
    let mut i = 0;
    while i < t.len() {
        let x = t[i];
        if x == b'\'' && prev == Some(b' ') && t.get(i + 1) == Some(&b' ') {
            out.pop();
            out.push(x);
            prev = Some(0);
            i += 2;
            continue;
        }
        out.push(x);
        prev = Some(x);
        i += 1;
    }
    out
}

fn contractions(t: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && x == b'\'' {
            let next = (t.get(i + 1).copied(), t.get(i + 2).copied());
            if matches!(
                next,
                (Some(b's' | b'm'), _) | (Some(b'r' | b'v'), Some(b'e'))
            ) {
                out.pop();
            }
        }
        out.push(x);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::clean_spaces;

    fn clean(s: &str) -> String {
        String::from_utf8(clean_spaces(s.as_bytes())).unwrap_or_default()
    }

    #[test]
    fn clean_spaces_passes() {
        assert_eq!(clean("a , b . c ? d !"), "a, b. c? d!");
        assert_eq!(clean(" ."), ".");
        assert_eq!(clean("rock ' n"), "rock'n");
        assert_eq!(clean("a ' ' b"), "a'' b");
        assert_eq!(clean("'s 't 're 've 'm 'll 'd"), "'s 't're've'm 'll 'd");
        assert_eq!(clean("x 's"), "x's");
        // Not at the very end: llama.cpp needs a character after the quote.
        assert_eq!(clean("x '"), "x '");
        assert_eq!(clean(""), "");
    }
}
