//! A chat answer that is one JSON document (a `response_format`), read as llama.cpp's chat
//! parser reads it: the whitespace around the document and a ```` ```json ```` fence are not
//! content ([`strip`] for a whole answer, [`JsonAnswerStream`] while streaming). The answer's
//! grammar ([`crate::grammar::schema::answer_to_gbnf`]) allows exactly those around it.

const FENCE_OPEN: &str = "```json";

/// The document of a whole answer.
pub fn strip(answer: &str) -> String {
    let mut stream = JsonAnswerStream::default();
    stream.push(answer)
}

/// An answer's document as its text comes: the opening whitespace and fence are dropped; a
/// run of whitespace and backticks is held until more of the document follows it, and dropped
/// at the end (a document ends with neither: that run is the closing space and fence).
#[derive(Debug, Default)]
pub struct JsonAnswerStream {
    /// The text before the document, while it may still be whitespace and a fence.
    lead: String,
    started: bool,
    held: String,
}

impl JsonAnswerStream {
    /// The document's text that `piece` makes certain.
    pub fn push(&mut self, piece: &str) -> String {
        let mut out = String::new();
        for c in piece.chars() {
            if self.started {
                self.body(c, &mut out);
                continue;
            }
            self.lead.push(c);
            let lead = self.lead.trim_start();
            let document = match lead.strip_prefix(FENCE_OPEN).map(str::trim_start) {
                Some("") => continue,
                Some(rest) => rest,
                None if FENCE_OPEN.starts_with(lead) => continue,
                None => lead,
            };
            let document = document.to_string();
            self.started = true;
            self.lead.clear();
            for c in document.chars() {
                self.body(c, &mut out);
            }
        }
        out
    }

    fn body(&mut self, c: char, out: &mut String) {
        if c.is_whitespace() || c == '`' {
            self.held.push(c);
        } else {
            out.push_str(&self.held);
            self.held.clear();
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_alone_is_the_answer() {
        for (answer, document) in [
            ("{\"a\": 1}", "{\"a\": 1}"),
            ("  \n{\"a\": [1, 2]}\n ", "{\"a\": [1, 2]}"),
            ("```json\n{\"a\": \"x ``` y\"}\n```", "{\"a\": \"x ``` y\"}"),
            ("\n```json {\"b\": true}```", "{\"b\": true}"),
            ("\"text\"", "\"text\""),
            ("``", ""),
            ("", ""),
        ] {
            assert_eq!(strip(answer), document, "{answer:?}");
        }
    }

    #[test]
    fn streamed_pieces_join_to_the_whole_answers_document() {
        let answer = "\n```json\n{\n  \"a\": \"`q` \",\n  \"b\": [1, 2]\n}\n```\n";
        for cut in 1..answer.len() {
            let mut stream = JsonAnswerStream::default();
            let mut joined = String::new();
            for piece in answer.as_bytes().chunks(cut) {
                joined += &stream.push(std::str::from_utf8(piece).expect("ascii"));
            }
            assert_eq!(joined, strip(answer), "pieces of {cut}");
        }
        assert_eq!(strip(answer), "{\n  \"a\": \"`q` \",\n  \"b\": [1, 2]\n}");
    }
}
