//! String concatenation with `+` as llama.cpp's Jinja engine does it: there, `'text' +
//! undefined` is the text (an undefined value concatenates as nothing), where minijinja (as
//! Python's Jinja) refuses to add a string and an undefined value. Chat templates rely on it
//! (`'): ' + param_fields.description` for a parameter without one, `suffix + "\n" +
//! functions` without tools), so such templates failed to render.
//!
//! The rewrite: in the template's expressions, a chain of operands joined by `+` alone (no
//! `-`) in which some operand starts with a string literal becomes a call of [`concat`] with
//! the operands as its arguments (`__concat(a, b, c)`), which adds them left to right as
//! llama.cpp does: strings concatenate, undefined counting as nothing; everything else as
//! minijinja's `+` (numbers add, lists concatenate, a string and anything else is an error,
//! which templates' capability probes rely on). The operands are whole: a chain ends only
//! where an operator of lower precedence than `+`, a separator or a bracket does.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// The function [`rewrite_string_concat`]'s calls name.
pub(super) const CONCAT: &str = "__concat";

/// `source` with each string-concatenating chain of its `{{ }}` and `{% %}` tags made a call
/// of [`concat`] (comments, string literals and `{% raw %}` blocks untouched).
pub(super) fn rewrite_string_concat(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut edits = Vec::new();
    let mut i = 0;
    let mut raw = false;
    while let Some(open) = find(bytes, i, b"{") {
        let kind = bytes.get(open + 1).copied();
        let close: &[u8] = match kind {
            Some(b'{') => b"}}",
            Some(b'%') => b"%}",
            Some(b'#') => b"#}",
            _ => {
                i = open + 1;
                continue;
            }
        };
        let body = open + 2;
        let Some(end) = tag_end(bytes, body, close) else {
            break;
        };
        if kind == Some(b'%') {
            let word = first_word(&bytes[body..end]);
            if word == b"raw" {
                raw = true;
            } else if word == b"endraw" {
                raw = false;
            }
        }
        if kind != Some(b'#') && !raw {
            edits.extend(
                concat_chains(&bytes[body..end])
                    .into_iter()
                    .map(|c| c.offset(body)),
            );
        }
        i = end + 2;
    }
    apply(source, &edits)
}

/// `source` with each chain's start preceded by `__concat(`, its `+` made `,` and its end
/// followed by `)`.
fn apply(source: &str, chains: &[Chain]) -> String {
    let mut at: Vec<(usize, &str, usize)> = Vec::new();
    for c in chains {
        at.push((c.start, "__concat(", 0));
        at.extend(c.pluses.iter().map(|&p| (p, ",", 1)));
        at.push((c.end, ")", 0));
    }
    // Inserts before replacements at one offset; a nested chain's `)` before the outer one's
    // (chains come innermost first where they end together).
    at.sort_by_key(|&(offset, _, replaced)| (offset, replaced));
    let mut out = String::with_capacity(source.len() + 16 * chains.len());
    let mut from = 0;
    for (offset, text, replaced) in at {
        out.push_str(&source[from..offset]);
        out.push_str(text);
        from = offset + replaced;
    }
    out.push_str(&source[from..]);
    out
}

/// The first occurrence of `pat` in `bytes` from `from`.
fn find(bytes: &[u8], from: usize, pat: &[u8]) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(pat.len())
        .position(|w| w == pat)
        .map(|p| p + from)
}

/// Where the tag whose body starts at `from` ends (`close`), skipping string literals.
fn tag_end(bytes: &[u8], from: usize, close: &[u8]) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') if close != b"#}" => i = string_end(bytes, i, q),
            _ if bytes[i..].starts_with(close) => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The index after the string literal opened by quote `q` at `at` (backslash escapes).
fn string_end(bytes: &[u8], at: usize, q: u8) -> usize {
    let mut i = at + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            c if c == q => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

fn first_word(body: &[u8]) -> &[u8] {
    let body = match body.first() {
        Some(b'-' | b'+') => &body[1..],
        _ => body,
    };
    let start = body
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(body.len());
    let len = body[start..]
        .iter()
        .position(|c| !c.is_ascii_alphanumeric() && *c != b'_')
        .unwrap_or(body.len() - start);
    &body[start..start + len]
}

/// One chain of operands at one bracket depth: its extent, the `+` offsets, whether a `-`
/// joins it too, and whether an operand starts with a string literal.
#[derive(Default)]
struct Chain {
    start: usize,
    end: usize,
    pluses: Vec<usize>,
    minus: bool,
    string: bool,
    /// No token yet.
    empty: bool,
    /// The next token starts an operand.
    operand_next: bool,
}

impl Chain {
    fn new() -> Chain {
        Chain {
            empty: true,
            operand_next: true,
            ..Chain::default()
        }
    }

    /// A token of the chain's at `at..end`.
    fn token(&mut self, at: usize, end: usize) {
        if self.empty {
            self.start = at;
            self.empty = false;
        }
        self.end = end;
    }

    /// The chain, if it concatenates strings.
    fn finish(self, out: &mut Vec<Chain>) {
        if self.string && !self.minus && !self.pluses.is_empty() {
            out.push(self);
        }
    }

    fn offset(mut self, by: usize) -> Chain {
        self.start += by;
        self.end += by;
        self.pluses.iter_mut().for_each(|p| *p += by);
        self
    }
}

/// Keywords that end an operand chain (lower precedence than `+`, or statement syntax).
const DELIMITING_WORDS: &[&[u8]] = &[
    b"and",
    b"or",
    b"not",
    b"in",
    b"if",
    b"else",
    b"for",
    b"set",
    b"recursive",
];

/// The chains of operands in the expression text `body` (a tag's inside) joined by `+` one of
/// which starts with a string literal, innermost first.
fn concat_chains(body: &[u8]) -> Vec<Chain> {
    let mut out = Vec::new();
    let mut chains = vec![Chain::new()];
    let mut i = 0;
    // Whitespace-control `-` / `+` at either end are not operators.
    if matches!(body.first(), Some(b'-' | b'+')) {
        i = 1;
    }
    let body = match body.last() {
        Some(b'-' | b'+') if body.len() > i => &body[..body.len() - 1],
        _ => body,
    };
    // After `is`, a `not` belongs to the test (`x is not none`).
    let mut after_is = false;
    while i < body.len() {
        let c = body[i];
        let Some(top) = chains.last_mut() else {
            break;
        };
        let mut next = i + 1;
        match c {
            _ if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'\'' | b'"' => {
                if top.operand_next {
                    top.string = true;
                }
                top.operand_next = false;
                next = string_end(body, i, c);
                top.token(i, next);
            }
            b'(' | b'[' | b'{' => {
                top.operand_next = false;
                top.token(i, next);
                chains.push(Chain::new());
            }
            b')' | b']' | b'}' => {
                if chains.len() > 1 {
                    if let Some(inner) = chains.pop() {
                        inner.finish(&mut out);
                    }
                }
                if let Some(outer) = chains.last_mut() {
                    outer.token(i, next);
                }
            }
            b'+' => {
                top.pluses.push(i);
                top.operand_next = true;
            }
            b'-' if !top.operand_next => {
                top.minus = true;
                top.operand_next = true;
            }
            // Lower precedence than `+`, or separators: the chain ends here.
            b',' | b':' | b'=' | b'<' | b'>' | b'!' => {
                std::mem::replace(top, Chain::new()).finish(&mut out);
                // `==`, `<=`, `>=`, `!=`: one operator.
                if body.get(i + 1) == Some(&b'=') {
                    next += 1;
                }
            }
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let len = body[i..]
                    .iter()
                    .position(|b| !b.is_ascii_alphanumeric() && *b != b'_')
                    .unwrap_or(body.len() - i);
                let word = &body[i..i + len];
                next = i + len;
                // An attribute name (`x.not`) is part of its operand.
                let attribute = i > 0 && body[i - 1] == b'.';
                let test_not = after_is && word == b"not";
                after_is = !attribute && word == b"is";
                if !attribute && !test_not && DELIMITING_WORDS.contains(&word) {
                    std::mem::replace(top, Chain::new()).finish(&mut out);
                } else {
                    top.operand_next = false;
                    top.token(i, next);
                }
                i = next;
                continue;
            }
            // Numbers, `.`, `|`, `*`, `/`, `%`, `~`, a unary `-`: within an operand.
            _ => {
                top.operand_next = false;
                top.token(i, next);
            }
        }
        after_is = false;
        i = next;
    }
    while let Some(chain) = chains.pop() {
        chain.finish(&mut out);
    }
    out
}

/// `__concat(a, b, ...)`: the operands added left to right as llama.cpp's engine adds them.
pub(super) fn concat(operands: &[Value]) -> Result<Value, Error> {
    let mut operands = operands.iter();
    let Some(first) = operands.next() else {
        return Ok(Value::from(""));
    };
    operands.try_fold(first.clone(), |acc, v| add(&acc, v))
}

/// `a + b`: strings (undefined counting as nothing) concatenate; numbers add (integers
/// exactly); lists concatenate; anything else is an error, as minijinja's `+`.
fn add(a: &Value, b: &Value) -> Result<Value, Error> {
    let text = |v: &Value| match v.kind() {
        ValueKind::String => v.as_str().map(str::to_string),
        ValueKind::Undefined => Some(String::new()),
        _ => None,
    };
    let strings = a.kind() == ValueKind::String || b.kind() == ValueKind::String;
    if let (true, Some(x), Some(y)) = (strings, text(a), text(b)) {
        return Ok(Value::from(x + &y));
    }
    match (a.kind(), b.kind()) {
        (ValueKind::Number, ValueKind::Number) => {
            let sum = match (i64::try_from(a.clone()), i64::try_from(b.clone())) {
                (Ok(x), Ok(y)) => x.checked_add(y).map(Value::from),
                _ => None,
            };
            let float = |v: &Value| f64::try_from(v.clone()).unwrap_or(f64::NAN);
            Ok(sum.unwrap_or_else(|| Value::from(float(a) + float(b))))
        }
        (ValueKind::Seq, ValueKind::Seq) => {
            let items = |v: &Value| v.try_iter().map(|i| i.collect::<Vec<_>>());
            let mut all = items(a)?;
            all.extend(items(b)?);
            Ok(Value::from(all))
        }
        (x, y) => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tried to use + operator on unsupported types {x} and {y}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_chains_become_calls() {
        let cases = [
            ("{{ 'a' + x }}", "{{ __concat('a' , x) }}"),
            (
                "{{- s + \"\\n\" + f -}}",
                "{{- __concat(s , \"\\n\" , f) -}}",
            ),
            (
                "{{ '\"n\": \"'|indent(8, first=true) + c.name + '\",' }}",
                "{{ __concat('\"n\": \"'|indent(8, first=true) , c.name , '\",') }}",
            ),
            (
                "{% set s = s + 'x' if a + 1 > 2 else y %}",
                "{% set s = __concat(s , 'x') if a + 1 > 2 else y %}",
            ),
            (
                "{{ f('a' + b, n + 1) }}",
                "{{ f(__concat('a' , b), n + 1) }}",
            ),
            (
                "{{ ('[' + x + ']') + 'y' }}",
                "{{ __concat((__concat('[' , x , ']')) , 'y') }}",
            ),
            (
                "{{ ' ' + k ~ '=' ~ v }}",
                "{{ __concat(' ' , k ~ '=' ~ v) }}",
            ),
            (
                "{{ 'a' + x is not none }}",
                "{{ __concat('a' , x is not none) }}",
            ),
        ];
        for (source, want) in cases {
            assert_eq!(rewrite_string_concat(source), want, "{source}");
        }
    }

    #[test]
    fn other_sums_and_text_stay() {
        let same = [
            "{{ loop.index0 + 1 }}",
            "{{ a + b }}",
            "{{ 'a' + x - 1 }}",
            "{{ [1] + xs }}",
            "text + 'quoted' {{ x }}",
            "{# 'a' + b #}",
            "{% raw %}{{ 'a' + b }}{% endraw %}",
            "{{ 'a + b' }}",
            "{{- x + 1 -}}",
            "{{+ 'a' }}",
        ];
        for source in same {
            assert_eq!(rewrite_string_concat(source), source, "{source}");
        }
    }

    fn render(source: &str, ctx: Value) -> Result<String, Error> {
        let mut env = minijinja::Environment::new();
        env.add_function(CONCAT, concat);
        env.add_template_owned("t", rewrite_string_concat(source))?;
        env.get_template("t")?.render(ctx)
    }

    /// Undefined operands concatenate as nothing; numbers and lists add as before; a string
    /// and a mapping (or a number) are an error, as minijinja's `+` and llama.cpp's engine.
    #[test]
    fn operands_add_as_llama_cpp_adds_them() {
        let ctx = minijinja::context! { m => minijinja::context! {}, n => 2, xs => vec![1] };
        let out = render(
            "{{ 'a' + m.name + 'b' }}|{{ n + 1 }}|{{ 'c' + (xs + [2])|string }}",
            ctx,
        );
        assert_eq!(out.unwrap(), "ab|3|c[1, 2]");
        for bad in ["{{ 'a' + m }}", "{{ 'a' + n }}"] {
            let ctx = minijinja::context! { m => minijinja::context! { k => 1 }, n => 2 };
            assert!(render(bad, ctx).is_err(), "{bad}");
        }
        assert_eq!(
            concat(&[Value::from(1), Value::from(2)]).unwrap(),
            Value::from(3)
        );
        let lists = concat(&[Value::from(vec![1]), Value::from(vec![2])]).unwrap();
        assert_eq!(lists, Value::from(vec![1, 2]));
    }
}
