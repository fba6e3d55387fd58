//! A JSON Schema `pattern` (an ECMA-262 regular expression) as a GBNF expression of the JSON
//! string text whose value it matches, as llama.cpp's `json_schema_to_grammar` writes
//! patterns: literals, `.`, classes (ranges, negation, `\d \w \s` and their complements),
//! groups (`(...)`, `(?:...)`), alternation and the quantifiers `* + ? {n} {n,} {n,m}`
//! (lazy ones read as greedy: a grammar allows the same strings). Without `^` or `$` the match
//! may start or end anywhere in the string, as a schema's pattern searches.
//!
//! The expression writes the JSON text of the string: `"` and `\` as their escapes, and
//! `.` or a negated class never a control character (JSON text cannot hold one raw).
//! Backreferences, lookarounds, `\b` and flags are refused by name.

use super::GrammarError;

/// What a `.` or a negated class may be in JSON string text besides what it excludes.
const JSON_CHAR_EXCLUDES: &str = "\"\\\\\\x00-\\x1F";

fn refused(pattern: &str, what: &str) -> GrammarError {
    GrammarError::Schema(format!("`pattern` {pattern:?}: {what} is not supported"))
}

/// The GBNF expression of the JSON string text (without its quotes) of the strings
/// `pattern` matches.
pub(crate) fn to_gbnf(pattern: &str) -> Result<String, GrammarError> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut p = Parser {
        pattern,
        chars: &chars,
        at: 0,
    };
    let start = p.eat('^');
    let body = p.alternation()?;
    let end = p.eat('$');
    if p.at < chars.len() {
        return Err(refused(pattern, &format!("`{}` here", chars[p.at])));
    }
    let any = format!("[^{JSON_CHAR_EXCLUDES}]* ");
    let (head, tail) = (
        if start { "" } else { any.as_str() },
        if end { "" } else { any.as_str() },
    );
    Ok(format!("{head}({body}) {tail}").trim().to_string())
}

struct Parser<'a> {
    pattern: &'a str,
    chars: &'a [char],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        let found = self.peek() == Some(c);
        self.at += usize::from(found);
        found
    }

    fn next(&mut self) -> Result<char, GrammarError> {
        let c = self
            .peek()
            .ok_or_else(|| refused(self.pattern, "an unfinished expression"))?;
        self.at += 1;
        Ok(c)
    }

    /// `a|b|...` up to a `)` or the end (or a final `$`).
    fn alternation(&mut self) -> Result<String, GrammarError> {
        let mut alts = vec![self.sequence()?];
        while self.eat('|') {
            alts.push(self.sequence()?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self) -> Result<String, GrammarError> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' || (c == '$' && self.at + 1 == self.chars.len()) {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(match items.is_empty() {
            true => "\"\"".into(),
            false => items.join(" "),
        })
    }

    fn atom(&mut self) -> Result<String, GrammarError> {
        match self.next()? {
            '(' => {
                if self.eat('?') && !self.eat(':') {
                    return Err(refused(self.pattern, "a lookaround or named group"));
                }
                let inner = self.alternation()?;
                if !self.eat(')') {
                    return Err(refused(self.pattern, "an unclosed group"));
                }
                Ok(format!("({inner})"))
            }
            '[' => self.class(),
            '.' => Ok(format!("[^{JSON_CHAR_EXCLUDES}]")),
            '\\' => self.escape_item(),
            c @ ('*' | '+' | '?' | '{') => Err(refused(
                self.pattern,
                &format!("a `{c}` with nothing before it"),
            )),
            '^' | '$' => Err(refused(self.pattern, "an anchor inside the pattern")),
            c => Ok(json_char(c)),
        }
    }

    /// The atom with the quantifier that follows, if any.
    fn quantified(&mut self, atom: String) -> Result<String, GrammarError> {
        let q = match self.peek() {
            Some(c @ ('*' | '+' | '?')) => {
                self.at += 1;
                c.to_string()
            }
            Some('{') => self.braces()?,
            _ => return Ok(atom),
        };
        // A lazy or possessive mark changes which match, not whether.
        let _ = self.eat('?') || self.eat('+');
        Ok(format!("{atom}{q}"))
    }

    /// `{n}`, `{n,}`, `{n,m}` as GBNF writes them.
    fn braces(&mut self) -> Result<String, GrammarError> {
        let start = self.at;
        self.at += 1;
        let mut text = String::from("{");
        while let Some(c) = self.peek() {
            self.at += 1;
            text.push(c);
            if c == '}' {
                let body = &text[1..text.len() - 1];
                let ok = !body.is_empty()
                    && body.chars().all(|c| c.is_ascii_digit() || c == ',')
                    && body.matches(',').count() <= 1
                    && !body.starts_with(',');
                if ok {
                    return Ok(text);
                }
                break;
            }
        }
        self.at = start;
        Err(refused(self.pattern, "a malformed `{...}` quantifier"))
    }

    /// An escape after its `\\`.
    fn escape(&mut self) -> Result<Escape, GrammarError> {
        let c = self.next()?;
        Ok(match c {
            'd' => Escape::Class("0-9", false),
            'D' => Escape::Class("0-9", true),
            'w' => Escape::Class("a-zA-Z0-9_", false),
            'W' => Escape::Class("a-zA-Z0-9_", true),
            's' => Escape::Space(false),
            'S' => Escape::Space(true),
            'n' => Escape::Char('\n'),
            't' => Escape::Char('\t'),
            'r' => Escape::Char('\r'),
            'f' => Escape::Char('\x0C'),
            'v' => Escape::Char('\x0B'),
            'u' => {
                let hex: String = (0..4).map_while(|_| self.next().ok()).collect();
                let code = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                Escape::Char(code.ok_or_else(|| refused(self.pattern, "a malformed `\\u` escape"))?)
            }
            c if c.is_ascii_digit() => return Err(refused(self.pattern, "a backreference")),
            'b' | 'B' => return Err(refused(self.pattern, "a word boundary")),
            c if c.is_ascii_alphanumeric() => {
                return Err(refused(self.pattern, &format!("the escape `\\{c}`")))
            }
            c => Escape::Char(c),
        })
    }

    /// An escape outside a class as a GBNF item.
    fn escape_item(&mut self) -> Result<String, GrammarError> {
        Ok(match self.escape()? {
            Escape::Char(c) => json_char(c),
            Escape::Class(members, false) => format!("[{members}]"),
            Escape::Class(members, true) => format!("[^{members}{JSON_CHAR_EXCLUDES}]"),
            Escape::Space(false) => SPACE_ITEM.to_string(),
            Escape::Space(true) => format!("[^ {JSON_CHAR_EXCLUDES}]"),
        })
    }

    /// `[...]` after its `[`: its members as a GBNF class, with the characters JSON text
    /// writes escaped (`"`, `\\`, control characters) as alternatives beside it.
    fn class(&mut self) -> Result<String, GrammarError> {
        let negated = self.eat('^');
        let mut members = String::new();
        let mut escaped: Vec<char> = Vec::new();
        let mut first = true;
        loop {
            let c = self.next()?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = match c {
                '\\' => match self.escape()? {
                    Escape::Char(c) => c,
                    Escape::Class(m, false) => {
                        members.push_str(m);
                        continue;
                    }
                    Escape::Space(false) => {
                        members.push(' ');
                        escaped.extend(['\t', '\n', '\r']);
                        continue;
                    }
                    Escape::Class(..) | Escape::Space(true) => {
                        return Err(refused(self.pattern, "a negated escape inside a class"))
                    }
                },
                c => c,
            };
            let range = self.peek() == Some('-') && self.chars.get(self.at + 1) != Some(&']');
            if !range {
                match needs_escape(lo) {
                    true => escaped.push(lo),
                    false => members.push_str(&class_member(lo)),
                }
                continue;
            }
            self.at += 1;
            let hi = match self.next()? {
                '\\' => match self.escape()? {
                    Escape::Char(c) => c,
                    _ => return Err(refused(self.pattern, "a range to a class escape")),
                },
                c => c,
            };
            if needs_escape(lo) || needs_escape(hi) || hi < lo {
                let what = "a range over quotes, backslashes or control characters, or backwards";
                return Err(refused(self.pattern, what));
            }
            members.push_str(&format!("{}-{}", class_member(lo), class_member(hi)));
        }
        if negated {
            // Never a quote, a backslash or a control character: JSON text escapes them.
            return Ok(format!("[^{members}{JSON_CHAR_EXCLUDES}]"));
        }
        let mut alts: Vec<String> = Vec::new();
        if !members.is_empty() {
            alts.push(format!("[{members}]"));
        }
        alts.extend(escaped.iter().map(|&c| json_char(c)));
        match alts.len() {
            0 => Err(refused(self.pattern, "an empty class")),
            1 => Ok(alts.remove(0)),
            _ => Ok(format!("({})", alts.join(" | "))),
        }
    }
}

/// An escape sequence's meaning.
enum Escape {
    /// One character.
    Char(char),
    /// `\\d`, `\\w` (members of a GBNF class) or their complements.
    Class(&'static str, bool),
    /// `\\s`, or `\\S`.
    Space(bool),
}

/// `\\s` outside a class: a space or the JSON escapes of tab, newline and carriage return.
const SPACE_ITEM: &str = "(\" \" | \"\\\\t\" | \"\\\\n\" | \"\\\\r\")";

/// Whether JSON text writes `c` escaped (a quote, a backslash, a control character).
fn needs_escape(c: char) -> bool {
    c == '"' || c == '\\' || (c as u32) < 0x20
}

/// A character of the string as its JSON text, as a GBNF literal: `"` and `\` escaped, control
/// characters as JSON's `\uXXXX` (or their short escapes).
fn json_char(c: char) -> String {
    let text = match c {
        '"' => "\\\\\\\"".to_string(),
        '\\' => "\\\\\\\\".to_string(),
        '\n' => "\\\\n".to_string(),
        '\t' => "\\\\t".to_string(),
        '\r' => "\\\\r".to_string(),
        c if (c as u32) < 0x20 => format!("\\\\u{:04x}", c as u32),
        c => c.to_string(),
    };
    format!("\"{text}\"")
}

/// A character inside a GBNF class (the class's own syntax as hex).
fn class_member(c: char) -> String {
    match c {
        ']' | '[' | '^' | '-' => format!("\\x{:02X}", c as u32),
        c => c.to_string(),
    }
}
