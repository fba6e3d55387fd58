//! llama.cpp's GBNF grammar text (`grammars/README.md` there) parsed into a [`RuleSet`]:
//! `name ::= alternatives`, one rule per line (newlines are free inside parentheses),
//! `"literals"`, `[character classes]` and `[^negated]` ones, `.`, rule names, `( groups )`,
//! and the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, which become generated rules;
//! `#` starts a comment. Escapes: `\x..`, `\u....`, `\U........`, `\t`, `\r`, `\n`, `\\`,
//! `\"`, `\[`, `\]`. Names take letters, digits, `-` (and `_`). llama.cpp's token references
//! (`<[id]>`, `!<...>`) are refused by name.

use super::rules::{CharClass, RuleId, RuleSet, Seq, Term, MAX_TERMS};
use super::{Grammar, GrammarError};

/// Parse `text` and check it; the start rule is `root`.
pub fn parse(text: &str) -> Result<Grammar, GrammarError> {
    let mut p = Parser {
        src: text,
        pos: 0,
        rules: RuleSet::default(),
    };
    p.space(true);
    while p.peek().is_some() {
        p.rule()?;
    }
    p.rules.finish("root")
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    rules: RuleSet,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn error(&self, what: impl Into<String>) -> GrammarError {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        GrammarError::Parse {
            line,
            col,
            what: what.into(),
        }
    }

    fn expect(&mut self, s: &str) -> Result<(), GrammarError> {
        match self.src[self.pos..].starts_with(s) {
            true => {
                self.pos += s.len();
                Ok(())
            }
            false => Err(self.error(format!("expected `{s}`"))),
        }
    }

    /// Skips blanks and comments, and line ends where `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    let rest = &self.src[self.pos..];
                    self.pos += rest.find(['\r', '\n']).unwrap_or(rest.len());
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<&str, GrammarError> {
        let rest = &self.src[self.pos..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(self.error("expected a rule name"));
        }
        self.pos += len;
        Ok(&self.src[self.pos - len..self.pos])
    }

    /// `name ::= alternatives` and the line end.
    fn rule(&mut self) -> Result<(), GrammarError> {
        let name = self.name()?.to_string();
        let id = self.rules.symbol(&name);
        self.space(false);
        self.expect("::=")?;
        self.space(true);
        let alts = self.alternatives(&name, false)?;
        self.rules.define(id, alts)?;
        match self.peek() {
            None => {}
            Some('\r' | '\n') => self.space(true),
            Some(_) => return Err(self.error("expected the end of the line")),
        }
        Ok(())
    }

    fn alternatives(&mut self, rule: &str, nested: bool) -> Result<Vec<Seq>, GrammarError> {
        let mut alts = vec![self.sequence(rule, nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(rule, nested)?);
        }
        Ok(alts)
    }

    /// Items with their repetitions, up to `|`, `)`, a line end outside parentheses or the
    /// end.
    fn sequence(&mut self, rule: &str, nested: bool) -> Result<Seq, GrammarError> {
        let mut seq = Seq::new();
        loop {
            let item = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => vec![Term::Chars(self.class()?)],
                Some('.') => {
                    self.pos += 1;
                    vec![Term::Chars(CharClass::any())]
                }
                Some('(') => {
                    self.pos += 1;
                    self.space(true);
                    let alts = self.alternatives(rule, true)?;
                    self.expect(")")?;
                    let id = self.rules.fresh(rule);
                    self.rules.define(id, alts)?;
                    vec![Term::Rule(id)]
                }
                Some('<' | '!') => return Err(self.error("token references are not supported")),
                Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let name = self.name()?.to_string();
                    vec![Term::Rule(self.rules.symbol(&name))]
                }
                _ => return Ok(seq),
            };
            self.space(nested);
            let item = self.repetition(rule, item)?;
            seq.extend(item);
            self.space(nested);
        }
    }

    /// `item` with the repetition that follows it, if any.
    fn repetition(&mut self, rule: &str, item: Vec<Term>) -> Result<Vec<Term>, GrammarError> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.pos += 1;
                self.space(false);
                return self.counted(rule, item);
            }
            _ => return Ok(item),
        };
        self.pos += 1;
        self.repeat(rule, item, min, max)
    }

    /// `{m}`, `{m,}` or `{m,n}` after the `{`.
    fn counted(&mut self, rule: &str, item: Vec<Term>) -> Result<Vec<Term>, GrammarError> {
        let min = self.count()?;
        self.space(false);
        let max = match self.peek() {
            Some(',') => {
                self.pos += 1;
                self.space(false);
                match self.peek() {
                    Some(c) if c.is_ascii_digit() => Some(self.count()?),
                    _ => None,
                }
            }
            _ => Some(min),
        };
        self.space(false);
        self.expect("}")?;
        if max.is_some_and(|max| max < min) {
            return Err(self.error(format!(
                "repetition {{{min},{}}} has max < min",
                max.unwrap_or(0)
            )));
        }
        self.repeat(rule, item, min, max)
    }

    fn count(&mut self) -> Result<usize, GrammarError> {
        let rest = &self.src[self.pos..];
        let len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n = rest[..len]
            .parse::<usize>()
            .map_err(|_| self.error("expected a repetition count"))?;
        self.pos += len;
        match n <= MAX_TERMS {
            true => Ok(n),
            false => Err(GrammarError::TooLarge(MAX_TERMS)),
        }
    }

    /// `item` `min` times, then up to `max - min` more (`None`: any number more), as
    /// llama.cpp rewrites repetitions: the optional tail nests (`x (x (x)?)?`), the unbounded
    /// one recurses on the right (`r ::= x r |`).
    fn repeat(
        &mut self,
        rule: &str,
        item: Vec<Term>,
        min: usize,
        max: Option<usize>,
    ) -> Result<Vec<Term>, GrammarError> {
        let term = match <[Term; 1]>::try_from(item) {
            Ok([t]) => t,
            Err(terms) => {
                let id = self.rules.fresh(rule);
                self.rules.define(id, vec![terms])?;
                Term::Rule(id)
            }
        };
        let mut out = vec![term.clone(); min];
        if out.len() > MAX_TERMS {
            return Err(GrammarError::TooLarge(MAX_TERMS));
        }
        let tail = match max {
            None => {
                let id = self.rules.fresh(rule);
                self.rules
                    .define(id, vec![vec![term, Term::Rule(id)], vec![]])?;
                Some(id)
            }
            Some(max) => {
                let mut inner: Option<RuleId> = None;
                for _ in min..max {
                    let id = self.rules.fresh(rule);
                    let mut seq = vec![term.clone()];
                    seq.extend(inner.map(Term::Rule));
                    self.rules.define(id, vec![seq, vec![]])?;
                    inner = Some(id);
                }
                inner
            }
        };
        out.extend(tail.map(Term::Rule));
        Ok(out)
    }

    /// `"..."`: one term per character.
    fn literal(&mut self) -> Result<Vec<Term>, GrammarError> {
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None | Some('\r' | '\n') => return Err(self.error("unterminated string")),
                Some('"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(_) => out.push(Term::Chars(CharClass::single(self.char()?))),
            }
        }
    }

    /// `[...]` or `[^...]`.
    fn class(&mut self) -> Result<CharClass, GrammarError> {
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some('\r' | '\n') => return Err(self.error("unterminated character class")),
                Some(']') => {
                    self.pos += 1;
                    return Ok(CharClass { ranges, negated });
                }
                Some(_) => {
                    let lo = self.char()?;
                    let rest = &self.src[self.pos..];
                    let hi = match rest.starts_with('-') && !rest.starts_with("-]") {
                        true => {
                            self.pos += 1;
                            self.char()?
                        }
                        false => lo,
                    };
                    ranges.push((lo, hi));
                }
            }
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<u32, GrammarError> {
        let c = self.bump().ok_or_else(|| self.error("unexpected end"))?;
        if c != '\\' {
            return Ok(c as u32);
        }
        let e = self
            .bump()
            .ok_or_else(|| self.error("unexpected end after `\\`"))?;
        Ok(match e {
            'x' => self.hex(2)?,
            'u' => self.hex(4)?,
            'U' => self.hex(8)?,
            't' => '\t' as u32,
            'r' => '\r' as u32,
            'n' => '\n' as u32,
            '\\' | '"' | '[' | ']' => e as u32,
            _ => return Err(self.error(format!("unknown escape `\\{e}`"))),
        })
    }

    fn hex(&mut self, digits: usize) -> Result<u32, GrammarError> {
        let text = self.src.get(self.pos..self.pos + digits);
        let value = text
            .filter(|t| t.chars().all(|c| c.is_ascii_hexdigit()))
            .and_then(|t| u32::from_str_radix(t, 16).ok())
            .ok_or_else(|| self.error(format!("expected {digits} hex digits")))?;
        self.pos += digits;
        Ok(value)
    }
}
