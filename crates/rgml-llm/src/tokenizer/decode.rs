//! Streaming detokenization: token pieces can end inside a UTF-8 character, so the
//! [`Decoder`] holds back an incomplete tail until the next token completes it.

use super::{TokenId, Tokenizer};
use crate::error::Result;

/// Turns a stream of token ids into text as it arrives. The concatenation of everything
/// [`Decoder::push`] and [`Decoder::finish`] return equals [`Tokenizer::decode`] of the
/// whole sequence, including U+FFFD for invalid bytes.
#[derive(Clone, Debug)]
pub struct Decoder<'t> {
    tok: &'t Tokenizer,
    special: bool,
    index: usize,
    pending: Vec<u8>,
}

impl<'t> Decoder<'t> {
    pub(crate) fn new(tok: &'t Tokenizer, special: bool) -> Decoder<'t> {
        Decoder {
            tok,
            special,
            index: 0,
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text that is now complete (possibly empty). Errors on
    /// an id outside the vocabulary, leaving the decoder as it was.
    pub fn push(&mut self, id: TokenId) -> Result<String> {
        let piece = self.tok.piece_at(self.index, id, self.special)?;
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
