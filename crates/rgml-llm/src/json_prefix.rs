//! Which texts can still become a JSON object: a byte-at-a-time pushdown automaton over RFC
//! 8259's grammar, for JSON-constrained sampling (the OpenAI `response_format`
//! `{"type": "json_object"}`), and [`FramedJson`], an object between two fixed texts (a
//! forced tool call). A sampler keeps one [`JsonPrefix`] per generation, asks it of
//! each candidate token's bytes ([`JsonPrefix::accepts`]) and feeds it the chosen one
//! ([`JsonPrefix::push`]); the answer may end once [`JsonPrefix::complete`] holds, and must
//! then.
//!
//! The state is `Copy` (nesting kept as one bit per level, up to [`MAX_DEPTH`]), so checking a
//! whole vocabulary per token costs no allocation. Bytes of 0x80 and above are taken inside
//! strings as they come (a token may end inside a UTF-8 character).

/// Deepest nesting of objects and arrays taken.
pub const MAX_DEPTH: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// A value (the root, an array element, an object member's value).
    Value,
    /// After `{`: a key or `}`.
    FirstKey,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `[`: a value or `]`.
    FirstElement,
    /// After a value inside an object or array: `,` or the closing bracket.
    AfterValue,
    /// The root value is whole: nothing more.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lexeme {
    None,
    /// Inside a string (`key`: an object's key); `escape`: 0, 1 after `\`, 2..=5 hex digits of
    /// `\u` still to come plus one.
    String {
        key: bool,
        escape: u8,
    },
    Number(Num),
    /// The bytes of `true`, `false` or `null` still to come.
    Literal(&'static [u8]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    FracStart,
    Frac,
    ExpStart,
    ExpSign,
    Exp,
}

impl Num {
    /// The number may end here.
    fn whole(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }

    fn step(self, b: u8) -> Option<Num> {
        Some(match (self, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::FracStart,
            (Num::FracStart | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::ExpStart,
            (Num::ExpStart, b'+' | b'-') => Num::ExpSign,
            (Num::ExpStart | Num::ExpSign | Num::Exp, b'0'..=b'9') => Num::Exp,
            _ => return None,
        })
    }
}

/// The state after a prefix of a JSON object (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonPrefix {
    expect: Expect,
    lexeme: Lexeme,
    /// One bit per open level, the innermost lowest: 1 an object, 0 an array.
    levels: u64,
    depth: u32,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix::object()
    }
}

impl JsonPrefix {
    /// Nothing yet; the root must be an object.
    pub fn object() -> JsonPrefix {
        JsonPrefix {
            expect: Expect::Value,
            lexeme: Lexeme::None,
            levels: 0,
            depth: 0,
        }
    }

    /// The text so far is a whole JSON object.
    pub fn complete(&self) -> bool {
        self.expect == Expect::Done
    }

    /// Whether `bytes` after the text so far still leave a prefix of a JSON object (an empty
    /// `bytes` does not: a token that writes nothing cannot move the answer on).
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        let mut next = *self;
        !bytes.is_empty() && next.push(bytes)
    }

    /// Takes `bytes`; `false` (the state then undefined) if they leave no JSON prefix.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(b))
    }

    fn step(&mut self, b: u8) -> bool {
        match self.lexeme {
            Lexeme::String { key, escape } => return self.string_byte(key, escape, b),
            Lexeme::Literal(rest) => {
                if rest.first() != Some(&b) {
                    return false;
                }
                self.lexeme = Lexeme::Literal(&rest[1..]);
                if rest.len() == 1 {
                    self.lexeme = Lexeme::None;
                    self.value_done();
                }
                return true;
            }
            Lexeme::Number(n) => match n.step(b) {
                Some(n) => {
                    self.lexeme = Lexeme::Number(n);
                    return true;
                }
                None if n.whole() => {
                    // The byte after a number is the next token's.
                    self.lexeme = Lexeme::None;
                    self.value_done();
                }
                None => return false,
            },
            Lexeme::None => {}
        }
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return self.expect != Expect::Done;
        }
        match (self.expect, b) {
            (Expect::Value | Expect::FirstElement, _) if self.depth == 0 && b != b'{' => false,
            (Expect::Value | Expect::FirstElement, _) => self.value_start(b),
            (Expect::FirstKey | Expect::Key, b'"') => {
                self.lexeme = Lexeme::String {
                    key: true,
                    escape: 0,
                };
                true
            }
            (Expect::FirstKey, b'}') | (Expect::AfterValue, b'}') if self.in_object() => {
                self.close()
            }
            (Expect::AfterValue, b']') if !self.in_object() => self.close(),
            (Expect::Colon, b':') => {
                self.expect = Expect::Value;
                true
            }
            (Expect::AfterValue, b',') => {
                self.expect = if self.in_object() {
                    Expect::Key
                } else {
                    Expect::Value
                };
                true
            }
            _ => false,
        }
    }

    /// The first byte of a value.
    fn value_start(&mut self, b: u8) -> bool {
        if self.expect == Expect::FirstElement && b == b']' {
            return self.close();
        }
        match b {
            b'{' => self.open(true, Expect::FirstKey),
            b'[' => self.open(false, Expect::FirstElement),
            b'"' => {
                self.lexeme = Lexeme::String {
                    key: false,
                    escape: 0,
                };
                true
            }
            b'-' => self.number(Num::Minus),
            b'0' => self.number(Num::Zero),
            b'1'..=b'9' => self.number(Num::Int),
            b't' => self.literal(b"rue"),
            b'f' => self.literal(b"alse"),
            b'n' => self.literal(b"ull"),
            _ => false,
        }
    }

    fn number(&mut self, n: Num) -> bool {
        self.lexeme = Lexeme::Number(n);
        true
    }

    fn literal(&mut self, rest: &'static [u8]) -> bool {
        self.lexeme = Lexeme::Literal(rest);
        true
    }

    fn string_byte(&mut self, key: bool, escape: u8, b: u8) -> bool {
        let escape = match (escape, b) {
            (0, b'"') => {
                self.lexeme = Lexeme::None;
                if key {
                    self.expect = Expect::Colon;
                } else {
                    self.value_done();
                }
                return true;
            }
            (0, b'\\') => 1,
            (0, 0..=0x1f) => return false,
            (0, _) => 0,
            (1, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => 0,
            (1, b'u') => 5,
            (1, _) => return false,
            (n, b) if b.is_ascii_hexdigit() => {
                if n == 2 {
                    0
                } else {
                    n - 1
                }
            }
            _ => return false,
        };
        self.lexeme = Lexeme::String { key, escape };
        true
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && self.levels & 1 == 1
    }

    fn open(&mut self, object: bool, expect: Expect) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        self.levels = (self.levels << 1) | u64::from(object);
        self.depth += 1;
        self.expect = expect;
        true
    }

    fn close(&mut self) -> bool {
        self.levels >>= 1;
        self.depth -= 1;
        self.value_done();
        true
    }

    fn value_done(&mut self) {
        self.expect = if self.depth == 0 {
            Expect::Done
        } else {
            Expect::AfterValue
        };
    }
}

/// Where a [`FramedJson`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// This many bytes of a prefix written, which the prefixes of these bits (bit `i`:
    /// `prefixes[i]`) begin with.
    Prefix(usize, u64),
    Json(JsonPrefix),
    /// This many bytes of the suffix written.
    Suffix(usize),
}

/// A JSON object between two fixed texts (a forced tool call: `<tool_call>\n` before the
/// call's object, `\n</tool_call>` after it, say); with both empty, a JSON object. The text
/// before may be one of several (a call of one of the tools: each with its name written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FramedJson {
    prefixes: Vec<String>,
    suffix: String,
    frame: Frame,
}

impl FramedJson {
    /// The most prefixes [`FramedJson::one_of`] takes.
    pub const MAX_PREFIXES: usize = 64;

    /// `prefix`, a JSON object, `suffix`.
    pub fn new(prefix: &str, suffix: &str) -> FramedJson {
        FramedJson::one_of(&[prefix.to_string()], suffix)
    }

    /// One of `prefixes` (none of which may begin another; the first
    /// [`FramedJson::MAX_PREFIXES`] are taken, none: an empty one), a JSON object, `suffix`.
    pub fn one_of(prefixes: &[String], suffix: &str) -> FramedJson {
        let mut prefixes: Vec<String> = prefixes.iter().take(Self::MAX_PREFIXES).cloned().collect();
        if prefixes.is_empty() {
            prefixes.push(String::new());
        }
        let all = u64::MAX >> (64 - prefixes.len());
        FramedJson {
            prefixes,
            suffix: suffix.to_string(),
            frame: Frame::Prefix(0, all),
        }
    }

    /// The whole frame is written.
    pub fn complete(&self) -> bool {
        self.after(self.frame) == Frame::Suffix(self.suffix.len())
    }

    /// Whether `bytes` after the text so far still leave a prefix of the frame (an empty
    /// `bytes` does not).
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        !bytes.is_empty() && self.run(self.frame, bytes).is_some()
    }

    /// Takes `bytes`; `false` (the state unchanged) if they leave no prefix of the frame.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        match self.run(self.frame, bytes) {
            Some(frame) => {
                self.frame = frame;
                true
            }
            None => false,
        }
    }

    /// `frame` moved past the parts already whole (a whole prefix, a complete object).
    fn after(&self, frame: Frame) -> Frame {
        match frame {
            Frame::Prefix(n, alive) if self.alive(alive).any(|p| p.len() == n) => {
                Frame::Json(JsonPrefix::object())
            }
            Frame::Json(json) if json.complete() => Frame::Suffix(0),
            other => other,
        }
    }

    /// The prefixes whose bits `alive` has.
    fn alive(&self, alive: u64) -> impl Iterator<Item = &String> {
        (self.prefixes.iter().enumerate())
            .filter(move |(i, _)| alive >> i & 1 == 1)
            .map(|(_, p)| p)
    }

    fn run(&self, mut frame: Frame, bytes: &[u8]) -> Option<Frame> {
        for &b in bytes {
            frame = self.after(frame);
            frame = match frame {
                Frame::Prefix(n, alive) => {
                    let next = (0..self.prefixes.len())
                        .filter(|&i| alive >> i & 1 == 1)
                        .filter(|&i| self.prefixes[i].as_bytes().get(n) == Some(&b))
                        .fold(0u64, |m, i| m | 1 << i);
                    (next != 0).then_some(Frame::Prefix(n + 1, next))?
                }
                Frame::Json(mut json) => json.push(&[b]).then_some(Frame::Json(json))?,
                Frame::Suffix(n) => {
                    (self.suffix.as_bytes().get(n) == Some(&b)).then_some(Frame::Suffix(n + 1))?
                }
            };
        }
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &[&str] = &[
        "{}",
        " { }",
        r#"{"a": 1}"#,
        r#"{"a": -0.5e+10, "b": [true, false, null, "x\n\"\u00e9", {"c": []}], "d": {}}"#,
        "{\"é\": \"naïve 😀\", \"n\": [0, 12, 3.25, 1E3, -7]}",
        "{\n  \"list\": [\n    1,\n    2\n  ]\n}",
    ];

    const INVALID: &[&str] = &[
        "[1]",
        "1",
        "\"x\"",
        "{a: 1}",
        "{\"a\" 1}",
        "{\"a\": 01}",
        "{\"a\": 1,}",
        "{\"a\": [1,]}",
        "{\"a\": tru}x",
        "{\"a\": \"\\x\"}",
        "{\"a\": \"\u{1}\"}",
        "{\"a\": 1.}",
        "{\"a\": -}",
        "{\"a\": 1]",
        "{\"a\": [1}",
        "{} {}",
        "{\"a\": \"\\u12G4\"}",
    ];

    /// Every prefix of valid JSON is taken, the whole is complete, and no proper prefix is;
    /// serde_json agrees on what is JSON. Nothing may follow the root (the answer ends).
    #[test]
    fn valid_objects_are_taken_byte_by_byte() {
        for text in VALID {
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_ok(),
                "{text}"
            );
            let mut state = JsonPrefix::object();
            for (i, &b) in text.as_bytes().iter().enumerate() {
                assert!(!state.complete(), "{text}: complete before byte {i}");
                assert!(state.push(&[b]), "{text}: refused at byte {i}");
            }
            assert!(state.complete(), "{text}");
            assert!(!state.accepts(b" "), "{text}: nothing may follow");
        }
    }

    /// Invalid texts are refused, or never complete.
    #[test]
    fn invalid_texts_are_refused() {
        for text in INVALID {
            assert!(serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .filter(serde_json::Value::is_object)
                .is_none());
            let mut state = JsonPrefix::object();
            let taken = state.push(text.as_bytes());
            assert!(!(taken && state.complete()), "{text} taken as whole JSON");
        }
    }

    #[test]
    fn framed_objects_write_their_prefix_object_and_suffix() {
        let mut frame = FramedJson::new("<tool_call>\n", "\n</tool_call>");
        assert!(!frame.accepts(b"{"));
        assert!(frame.accepts(b"<tool"));
        assert!(frame.push(b"<tool_call>\n{\"name\": \"f\", "));
        assert!(!frame.complete());
        assert!(frame.push(b"\"arguments\": {}}"));
        assert!(!frame.complete());
        assert!(!frame.accepts(b" "));
        assert!(frame.accepts(b"\n</tool"));
        assert!(frame.push(b"\n</tool_call>"));
        assert!(frame.complete());
        assert!(!frame.accepts(b"x"));
        let mut plain = FramedJson::new("", "");
        assert!(!plain.complete());
        assert!(plain.push(b"{\"a\": [1, 2]}"));
        assert!(plain.complete());
        let names: Vec<String> = ["get", "get_all", "put"]
            .iter()
            .map(|n| format!("{{\"name\": \"{n}\", \"arguments\": "))
            .collect();
        let one_of = FramedJson::one_of(&names, "}");
        assert!(one_of.accepts(b"{\"name\": \"ge"));
        assert!(one_of.accepts(b"{\"name\": \"get\""));
        assert!(one_of.accepts(b"{\"name\": \"get_all\", \"arguments\": {}}"));
        assert!(one_of.accepts(b"{\"name\": \"put\", \"arguments\": {\"a\": 1}}"));
        assert!(!one_of.accepts(b"{\"name\": \"got"));
        assert!(!one_of.accepts(b"{\"name\": \"get_\""));
        assert!(!one_of.accepts(b"{\"name\": \"put\", \"arguments\": 1"));
        let mut named = FramedJson::new("{\"name\": \"f\", \"arguments\": ", "}");
        assert!(named.push(b"{\"name\": \"f\", \"arguments\": {\"x\": 1}"));
        assert!(!named.complete());
        assert!(named.push(b"}"));
        assert!(named.complete());
    }

    #[test]
    fn tokens_are_checked_whole_and_empty_ones_refused() {
        let state = JsonPrefix::object();
        assert!(state.accepts(b"{\""));
        assert!(state.accepts(b" {"));
        assert!(!state.accepts(b""));
        assert!(!state.accepts(b"Sure"));
        let mut state = JsonPrefix::object();
        assert!(state.push(b"{\"a\": [1"));
        assert!(state.accepts(b"0, 2]}"));
        assert!(!state.accepts(b"0, 2}}"));
        let mut deep = JsonPrefix::object();
        assert!(deep.push(b"{\"a\":"));
        for _ in 1..MAX_DEPTH {
            assert!(deep.push(b"["));
        }
        assert!(!deep.accepts(b"["), "nesting is capped");
    }
}
