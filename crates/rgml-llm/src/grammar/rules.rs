//! A compiled grammar: rules of alternatives of sequences, whose terms are character classes
//! over Unicode code points or references to rules (llama.cpp's `llama_grammar_element`s
//! without its repetition forms, which [`super::gbnf`] rewrites into rules). [`RuleSet`]
//! collects rules by name and checks the whole before it becomes a [`Grammar`]: every rule
//! defined, a `root`, and no rule that can reach itself without reading a character (the
//! matcher expands rules eagerly and would not stop).

use super::GrammarError;
use std::collections::HashMap;

/// A rule's index in its grammar.
pub(crate) type RuleId = u32;

/// The most terms a grammar may hold (repetition counts multiply them).
pub const MAX_TERMS: usize = 1 << 20;

/// A set of code points: inclusive ranges, or everything outside them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CharClass {
    pub(crate) ranges: Vec<(u32, u32)>,
    pub(crate) negated: bool,
}

impl CharClass {
    /// One code point.
    pub(crate) fn single(c: u32) -> CharClass {
        CharClass {
            ranges: vec![(c, c)],
            negated: false,
        }
    }

    /// Any code point (`.`).
    pub(crate) fn any() -> CharClass {
        CharClass {
            ranges: Vec::new(),
            negated: true,
        }
    }

    pub(crate) fn matches(&self, c: u32) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }

    /// Whether some code point in `lo..=hi` is in the class (for a character read only in
    /// part: its first UTF-8 bytes fix such a range).
    pub(crate) fn meets(&self, lo: u32, hi: u32) -> bool {
        if !self.negated {
            return self.ranges.iter().any(|&(a, b)| a <= hi && lo <= b);
        }
        // Some point of lo..=hi is outside every range: walk up from lo past the ranges that
        // cover it.
        let mut c = lo;
        loop {
            match self.ranges.iter().find(|&&(a, b)| a <= c && c <= b) {
                None => return true,
                Some(&(_, b)) if b >= hi => return false,
                Some(&(_, b)) => c = b + 1,
            }
        }
    }
}

/// One term of a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Term {
    Chars(CharClass),
    Rule(RuleId),
}

/// A sequence of terms: one alternative of a rule.
pub(crate) type Seq = Vec<Term>;

/// A checked grammar, ready for [`super::Matcher`]s.
#[derive(Debug, PartialEq, Eq)]
pub struct Grammar {
    /// Each rule's alternatives.
    pub(crate) rules: Vec<Vec<Seq>>,
    pub(crate) names: Vec<String>,
    pub(crate) root: RuleId,
}

impl Grammar {
    /// The rule's name.
    pub(crate) fn name(&self, rule: RuleId) -> &str {
        self.names.get(rule as usize).map_or("?", String::as_str)
    }
}

/// Rules being collected by name.
#[derive(Default)]
pub(crate) struct RuleSet {
    rules: Vec<Option<Vec<Seq>>>,
    names: Vec<String>,
    ids: HashMap<String, RuleId>,
    n_terms: usize,
}

impl RuleSet {
    /// The rule named `name`, defined or not yet.
    pub(crate) fn symbol(&mut self, name: &str) -> RuleId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.rules.len() as RuleId;
        self.rules.push(None);
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    /// A new rule for a group or repetition inside `parent`.
    pub(crate) fn fresh(&mut self, parent: &str) -> RuleId {
        let mut n = self.rules.len();
        loop {
            let name = format!("{parent}_{n}");
            if !self.ids.contains_key(&name) {
                return self.symbol(&name);
            }
            n += 1;
        }
    }

    /// Define rule `id` (a second definition of a name replaces the first, as in llama.cpp).
    pub(crate) fn define(&mut self, id: RuleId, alts: Vec<Seq>) -> Result<(), GrammarError> {
        self.n_terms += alts.iter().map(Vec::len).sum::<usize>() + 1;
        if self.n_terms > MAX_TERMS {
            return Err(GrammarError::TooLarge(MAX_TERMS));
        }
        self.rules[id as usize] = Some(alts);
        Ok(())
    }

    /// The checked grammar starting at `root`.
    pub(crate) fn finish(self, root: &str) -> Result<Grammar, GrammarError> {
        let root = *self.ids.get(root).ok_or(GrammarError::NoRoot)?;
        let mut rules = Vec::with_capacity(self.rules.len());
        for (id, alts) in self.rules.into_iter().enumerate() {
            rules.push(alts.ok_or_else(|| GrammarError::Undefined(self.names[id].clone()))?);
        }
        let grammar = Grammar {
            rules,
            names: self.names,
            root: root as RuleId,
        };
        check_left_recursion(&grammar)?;
        Ok(grammar)
    }
}

/// Which rules can match the empty text.
fn nullable(g: &Grammar) -> Vec<bool> {
    let mut null = vec![false; g.rules.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for (r, alts) in g.rules.iter().enumerate() {
            if null[r] {
                continue;
            }
            let empty = |t: &Term| matches!(t, Term::Rule(s) if null[*s as usize]);
            if alts.iter().any(|seq| seq.iter().all(empty)) {
                null[r] = true;
                changed = true;
            }
        }
    }
    null
}

/// Refuses a rule that reaches itself before any character (directly, `a ::= a "x"`, or
/// through rules that can match nothing).
fn check_left_recursion(g: &Grammar) -> Result<(), GrammarError> {
    let null = nullable(g);
    // The rules each rule can begin with.
    let firsts: Vec<Vec<RuleId>> = (g.rules.iter())
        .map(|alts| {
            let mut out = Vec::new();
            for seq in alts {
                for term in seq {
                    match term {
                        Term::Chars(_) => break,
                        Term::Rule(s) => {
                            out.push(*s);
                            if !null[*s as usize] {
                                break;
                            }
                        }
                    }
                }
            }
            out
        })
        .collect();
    // Depth-first search, 0: unseen, 1: on the path, 2: done.
    let mut mark = vec![0u8; g.rules.len()];
    for start in 0..g.rules.len() {
        if mark[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = 1;
        while let Some(&mut (r, ref mut next)) = path.last_mut() {
            match firsts[r].get(*next) {
                Some(&s) => {
                    *next += 1;
                    match mark[s as usize] {
                        0 => {
                            mark[s as usize] = 1;
                            path.push((s as usize, 0));
                        }
                        1 => return Err(GrammarError::LeftRecursion(g.name(s).to_string())),
                        _ => {}
                    }
                }
                None => {
                    mark[r] = 2;
                    path.pop();
                }
            }
        }
    }
    Ok(())
}
