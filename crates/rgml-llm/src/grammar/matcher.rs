//! Which texts a [`Grammar`] still allows after the text so far, byte by byte: a set of parse
//! stacks, as llama.cpp's `llama_grammar` keeps them, each with a character class on top.
//!
//! Stacks are interned frames (a position in a rule and the stack below it), and sets of
//! stacks are interned states, so a step is a table lookup once seen: checking a whole
//! vocabulary per token ([`super::vocab`]) revisits the same few states for most tokens.
//! Rules are expanded when a position is reached, with the tail call dropped (a position at
//! the end of its sequence returns at once), so `x*`'s stack does not grow with the text.
//! Bytes of a character still incomplete are checked against the ranges of code points
//! they can begin.

use super::rules::{CharClass, Grammar, RuleId, Term};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A position in a grammar: the next term of one alternative of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Pos {
    rule: RuleId,
    alt: u32,
    idx: u32,
}

impl Pos {
    fn next(self) -> Pos {
        Pos {
            idx: self.idx + 1,
            ..self
        }
    }
}

/// An interned stack: its top frame's index.
type StackId = u32;
/// The empty stack: the grammar's text is complete.
const EMPTY: StackId = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Frame {
    pos: Pos,
    below: StackId,
}

/// A character begun but not complete: its bits so far, how many bytes are to come, and the
/// least code point its length may encode (a shorter one would be an overlong form).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Utf8 {
    value: u32,
    left: u8,
    min: u32,
}

/// Code points UTF-8 may not encode: the surrogates.
const SURROGATES: std::ops::RangeInclusive<u32> = 0xD800..=0xDFFF;

impl Utf8 {
    /// Takes byte `b`: the next partial state, and the character when it completes; `None`
    /// for a byte that cannot come here in well-formed UTF-8 (a stray continuation byte, an
    /// overlong form, a surrogate, past U+10FFFF).
    fn take(self, b: u8) -> Option<(Utf8, Option<u32>)> {
        if self.left > 0 {
            if b & 0xC0 != 0x80 {
                return None;
            }
            let next = Utf8 {
                value: self.value << 6 | u32::from(b & 0x3F),
                left: self.left - 1,
                min: self.min,
            };
            let (lo, hi) = next.range()?;
            return Some(match next.left {
                0 if lo == hi => (Utf8::default(), Some(lo)),
                0 => return None,
                _ => (next, None),
            });
        }
        let (value, left, min) = match b {
            0x00..=0x7F => return Some((Utf8::default(), Some(u32::from(b)))),
            0xC2..=0xDF => (b & 0x1F, 1, 0x80),
            0xE0..=0xEF => (b & 0x0F, 2, 0x800),
            0xF0..=0xF4 => (b & 0x07, 3, 0x1_0000),
            _ => return None,
        };
        let value = u32::from(value);
        Some((Utf8 { value, left, min }, None))
    }

    /// The code points the character can still become, as a range of valid ones (`None`:
    /// only invalid ones: overlong, surrogates, past U+10FFFF).
    fn range(self) -> Option<(u32, u32)> {
        let shift = 6 * u32::from(self.left);
        let lo = (self.value << shift).max(self.min);
        let hi = (self.value << shift | ((1 << shift) - 1)).min(0x10_FFFF);
        let only_surrogates = SURROGATES.contains(&lo) && SURROGATES.contains(&hi);
        (lo <= hi && !only_surrogates).then_some((lo, hi))
    }
}

/// A set of stacks (sorted, [`EMPTY`] last) and a partial character.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    stacks: Box<[StackId]>,
    utf8: Utf8,
}

/// An interned state.
pub(crate) type StateId = u32;
/// No text is allowed.
pub(crate) const DEAD: StateId = u32::MAX;

/// The class of no character.
static NOTHING: CharClass = CharClass {
    ranges: Vec::new(),
    negated: false,
};

/// Interned states past which the caches are dropped (they are rebuilt as needed).
const MAX_STATES: usize = 1 << 20;

/// The most parse stacks one state may hold. An ambiguous grammar can need a number
/// exponential in the text (`x ::= "a" x "b" | "a" x "c" | ""` has 2^n after n a's); a state
/// past this is refused (no text leads there) and [`Matcher::overflowed`] says so, instead of
/// the step taking time and memory without bound.
pub const MAX_STACKS: usize = 1 << 16;

/// The most stack ids all interned states may hold together (64 MiB): one walk over a
/// vocabulary visits many states, and each may be large. New states past it are refused
/// likewise until the next token drops the caches.
const MAX_STORED: usize = 1 << 24;

/// One generation's progress through a grammar.
pub struct Matcher {
    grammar: Arc<Grammar>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, StackId>,
    /// Per stack: the stacks after its top character is read.
    successors: Vec<Option<Box<[StackId]>>>,
    states: Vec<State>,
    state_ids: HashMap<State, StateId>,
    steps: HashMap<(StateId, u8), StateId>,
    current: StateId,
    /// Stack ids held by `states`.
    stored: usize,
    /// A state was refused for [`MAX_STACKS`] or [`MAX_STORED`] since the last token.
    overflowed: bool,
}

impl Matcher {
    /// At the start of `grammar`'s root rule.
    pub fn new(grammar: Arc<Grammar>) -> Matcher {
        let mut m = Matcher {
            grammar,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            successors: Vec::new(),
            states: Vec::new(),
            state_ids: HashMap::new(),
            steps: HashMap::new(),
            current: DEAD,
            stored: 0,
            overflowed: false,
        };
        let root = m.grammar.root;
        let mut stacks = Vec::new();
        for alt in 0..m.grammar.rules[root as usize].len() as u32 {
            let pos = Pos {
                rule: root,
                alt,
                idx: 0,
            };
            m.expand(pos, EMPTY, &mut stacks);
        }
        m.current = m.intern_stacks(stacks, Utf8::default());
        m
    }

    /// Whether `bytes` after the text so far leave text the grammar allows more of (an
    /// empty `bytes` does not).
    pub fn accepts(&mut self, bytes: &[u8]) -> bool {
        !bytes.is_empty() && self.run(self.current, bytes) != DEAD
    }

    /// Takes `bytes`; `false` (nothing changed) if the grammar does not allow them.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        let next = self.run(self.current, bytes);
        if next == DEAD {
            return false;
        }
        self.current = next;
        self.overflowed = false;
        if self.states.len() > MAX_STATES || self.stored > MAX_STORED / 2 {
            self.forget_states();
        }
        true
    }

    /// Whether a text was refused since the last [`push`](Self::push) only because following
    /// it would take more than [`MAX_STACKS`] parse stacks (or too many states at once): the
    /// grammar is too ambiguous, not the text wrong.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The text so far is a whole sentence of the grammar.
    pub fn complete(&self) -> bool {
        let Some(state) = self.states.get(self.current as usize) else {
            return false;
        };
        state.utf8.left == 0 && state.stacks.last() == Some(&EMPTY)
    }

    /// The text is complete and nothing may follow.
    pub fn finished(&self) -> bool {
        self.complete() && self.states[self.current as usize].stacks.len() == 1
    }

    pub(crate) fn current(&self) -> StateId {
        self.current
    }

    fn run(&mut self, mut state: StateId, bytes: &[u8]) -> StateId {
        for &b in bytes {
            state = self.step(state, b);
            if state == DEAD {
                break;
            }
        }
        state
    }

    /// The state after byte `b` ([`DEAD`] if the grammar does not allow it).
    pub(crate) fn step(&mut self, state: StateId, b: u8) -> StateId {
        if state == DEAD {
            return DEAD;
        }
        if let Some(&next) = self.steps.get(&(state, b)) {
            return next;
        }
        let overflowed_before = std::mem::take(&mut self.overflowed);
        let next = self.compute_step(state, b);
        // A step refused for the limits is not remembered: asked again (after the next
        // token), it says again why it is refused.
        if !self.overflowed {
            self.steps.insert((state, b), next);
        }
        self.overflowed |= overflowed_before;
        next
    }

    fn compute_step(&mut self, state: StateId, b: u8) -> StateId {
        let State { stacks, utf8 } = self.states[state as usize].clone();
        let Some((utf8, c)) = utf8.take(b) else {
            return DEAD;
        };
        let live = stacks.iter().copied().filter(|&s| s != EMPTY);
        let next = match c {
            Some(c) => {
                let mut next = Vec::new();
                for s in live {
                    if self.top(s).matches(c) {
                        next.extend_from_slice(self.successors(s));
                    }
                }
                next
            }
            None => {
                let Some((lo, hi)) = utf8.range() else {
                    return DEAD;
                };
                let any = live.clone().any(|s| self.top(s).meets(lo, hi));
                match any {
                    true => live.collect(),
                    false => Vec::new(),
                }
            }
        };
        self.intern_stacks(next, utf8)
    }

    /// The character class on top of stack `s` (every interned top is one).
    fn top(&self, s: StackId) -> &CharClass {
        let pos = self.frames[s as usize].pos;
        match &self.grammar.rules[pos.rule as usize][pos.alt as usize][pos.idx as usize] {
            Term::Chars(class) => class,
            // Not reached: frames are interned on top only where a class is.
            Term::Rule(_) => &NOTHING,
        }
    }

    fn successors(&mut self, s: StackId) -> &[StackId] {
        if self.successors[s as usize].is_none() {
            let Frame { pos, below } = self.frames[s as usize];
            let mut out = Vec::new();
            self.expand(pos.next(), below, &mut out);
            out.sort_unstable();
            out.dedup();
            self.successors[s as usize] = Some(out.into_boxed_slice());
        }
        self.successors[s as usize].as_deref().unwrap_or_default()
    }

    /// The stacks with a character class on top that position `pos` over stack `below`
    /// reaches without reading a character. A work list, not recursion: a client's grammar
    /// may chain thousands of rules that match nothing (`("a"?){0,100000}`), and each
    /// (position, stack) is expanded once however many paths reach it.
    fn expand(&mut self, pos: Pos, below: StackId, out: &mut Vec<StackId>) {
        let grammar = self.grammar.clone();
        let mut todo = vec![(pos, below)];
        let mut seen = HashSet::new();
        while let Some((pos, below)) = todo.pop() {
            if !seen.insert((pos, below)) {
                continue;
            }
            let seq = &grammar.rules[pos.rule as usize][pos.alt as usize];
            match seq.get(pos.idx as usize) {
                None if below == EMPTY => out.push(EMPTY),
                None => {
                    let frame = self.frames[below as usize];
                    todo.push((frame.pos, frame.below));
                }
                Some(Term::Chars(_)) => out.push(self.intern_frame(Frame { pos, below })),
                Some(Term::Rule(rule)) => {
                    // The return position, unless it is the sequence's end (a tail call).
                    let ret = match pos.idx as usize + 1 == seq.len() {
                        true => below,
                        false => self.intern_frame(Frame {
                            pos: pos.next(),
                            below,
                        }),
                    };
                    for alt in 0..grammar.rules[*rule as usize].len() as u32 {
                        let start = Pos {
                            rule: *rule,
                            alt,
                            idx: 0,
                        };
                        todo.push((start, ret));
                    }
                }
            }
        }
    }

    fn intern_frame(&mut self, frame: Frame) -> StackId {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as StackId;
        self.frames.push(frame);
        self.successors.push(None);
        self.frame_ids.insert(frame, id);
        id
    }

    fn intern_stacks(&mut self, mut stacks: Vec<StackId>, utf8: Utf8) -> StateId {
        if stacks.is_empty() {
            return DEAD;
        }
        stacks.sort_unstable();
        stacks.dedup();
        if stacks.len() > MAX_STACKS {
            self.overflowed = true;
            return DEAD;
        }
        let state = State {
            stacks: stacks.into_boxed_slice(),
            utf8,
        };
        if let Some(&id) = self.state_ids.get(&state) {
            return id;
        }
        if self.stored + state.stacks.len() > MAX_STORED {
            self.overflowed = true;
            return DEAD;
        }
        self.stored += state.stacks.len();
        let id = self.states.len() as StateId;
        self.states.push(state.clone());
        self.state_ids.insert(state, id);
        id
    }

    /// Drops every state but the current one and the steps between them.
    fn forget_states(&mut self) {
        let state = self.states[self.current as usize].clone();
        self.states.clear();
        self.state_ids.clear();
        self.steps.clear();
        self.stored = 0;
        self.current = self.intern_stacks(state.stacks.into_vec(), state.utf8);
    }
}
