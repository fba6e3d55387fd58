//! Choosing the next token from logits: logit biases, the penalties (repetition, frequency,
//! presence), top-k, top-p, min-p, temperature, then a seeded draw — llama.cpp's default
//! sampler chain, in that order — or greedy argmax when the temperature is 0.

use crate::error::{LlmError, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, VecDeque};

/// Sampler settings (llama.cpp's defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// Temperature; `<= 0` means greedy.
    pub temp: f32,
    /// Keep the `k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the best one (0: none).
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recent tokens by this (1: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtract this times a recent token's count from its logit (0: off; OpenAI's
    /// `frequency_penalty`).
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every token seen recently (0: off; OpenAI's
    /// `presence_penalty`).
    pub presence_penalty: f32,
    /// Added to a token's logit before anything else (`-inf`: never that token), as
    /// llama.cpp's `logit_bias`; a token listed twice gets both.
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed.
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: always the most likely token (temperature 0), no repetition penalty.
    /// The other settings are the defaults, which greedy decoding ignores; a penalty can be
    /// added with `SamplerParams { repeat_penalty: 1.1, ..SamplerParams::greedy() }`.
    pub fn greedy() -> Self {
        SamplerParams {
            temp: 0.0,
            ..Default::default()
        }
    }

    /// Each setting inside its range: `temp` finite and at least 0, `top_p` in (0, 1],
    /// `min_p` in [0, 1], `repeat_penalty` finite and above 0, the frequency and presence
    /// penalties finite, each logit bias finite or `-inf`. Outside them sampling would not
    /// fail but silently degenerate (NaN probabilities, nothing or everything kept).
    pub fn validate(&self) -> Result<()> {
        if let Some(&(_, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(b.is_finite() || *b == f32::NEG_INFINITY))
        {
            return Err(LlmError::InvalidSampler {
                name: "logit_bias",
                value: bias,
                range: "a finite value or -inf",
            });
        }
        let checks: [(&'static str, f32, bool, &'static str); 6] = [
            (
                "temp",
                self.temp,
                self.temp >= 0.0 && self.temp.is_finite(),
                "a finite value >= 0",
            ),
            (
                "top_p",
                self.top_p,
                self.top_p > 0.0 && self.top_p <= 1.0,
                "in (0, 1]",
            ),
            (
                "min_p",
                self.min_p,
                (0.0..=1.0).contains(&self.min_p),
                "in [0, 1]",
            ),
            (
                "repeat_penalty",
                self.repeat_penalty,
                self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite(),
                "a finite value > 0",
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                self.frequency_penalty.is_finite(),
                "finite",
            ),
            (
                "presence_penalty",
                self.presence_penalty,
                self.presence_penalty.is_finite(),
                "finite",
            ),
        ];
        match checks.into_iter().find(|check| !check.2) {
            Some((name, value, _, range)) => Err(LlmError::InvalidSampler { name, value, range }),
            None => Ok(()),
        }
    }
}

/// A stateful sampler (remembers recent tokens for the penalties, owns the random stream).
///
/// `Send`: one per sequence, used by whichever thread drives that sequence.
#[derive(Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: StdRng,
    recent: VecDeque<u32>,
    /// How often each token is in `recent`.
    counts: HashMap<u32, u32>,
    candidates: Vec<(u32, f32)>,
    /// Scratch: the logits after the penalty.
    penalized: Vec<f32>,
}

impl Sampler {
    /// The settings it samples with.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// A sampler with these settings (not checked here: [`Session::generate`] checks them,
    /// see [`SamplerParams::validate`]).
    ///
    /// [`Session::generate`]: crate::Session::generate
    pub fn new(params: SamplerParams) -> Sampler {
        Sampler {
            rng: StdRng::seed_from_u64(params.seed),
            params,
            recent: VecDeque::new(),
            counts: HashMap::new(),
            candidates: Vec::new(),
            penalized: Vec::new(),
        }
    }

    /// Remember `token` as generated or given (for the penalties).
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            if let Some(old) = self.recent.pop_front() {
                if let Some(n) = self.counts.get_mut(&old) {
                    *n -= 1;
                    if *n == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.recent.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// llama.cpp's `penalties` sampler on `penalized`: each distinct recent token once, its
    /// logit divided (positive) or multiplied (otherwise) by the repetition penalty, then less
    /// its count times the frequency penalty and the presence penalty.
    fn penalize(&mut self) {
        let p = &self.params;
        let (repeat, freq, present) = (p.repeat_penalty, p.frequency_penalty, p.presence_penalty);
        if repeat == 1.0 && freq == 0.0 && present == 0.0 {
            return;
        }
        for (&token, &count) in &self.counts {
            if let Some(l) = self.penalized.get_mut(token as usize) {
                *l = if *l <= 0.0 { *l * repeat } else { *l / repeat };
                *l -= count as f32 * freq + present;
            }
        }
    }

    /// Pick the next token from `logits` (one per vocabulary entry). Non-finite logits never win
    /// unless every logit is non-finite.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        self.penalized.clear();
        self.penalized.extend(
            logits
                .iter()
                .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l }),
        );
        for &(token, bias) in &p.logit_bias {
            if let Some(l) = self.penalized.get_mut(token as usize) {
                *l += bias;
            }
        }
        self.penalize();
        let p = &self.params;
        if p.temp <= 0.0 {
            return argmax(&self.penalized);
        }
        let c = &mut self.candidates;
        c.clear();
        match p.top_k > 0 && p.top_k < self.penalized.len() {
            true => top_k(&self.penalized, p.top_k, c),
            false => c.extend(
                self.penalized
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l)),
            ),
        }
        c.sort_unstable_by(by_logit_desc);
        let probs = softmax(c.iter().map(|x| x.1), 1.0);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let best = c.first().map(|x| x.1).unwrap_or(0.0);
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p).
            let floor = best + p.min_p.ln();
            let keep = c.iter().take_while(|x| x.1 >= floor).count();
            c.truncate(keep.max(1));
        }
        let probs = softmax(c.iter().map(|x| x.1), p.temp);
        let r: f64 = self.rng.gen();
        let mut cum = 0.0;
        for (i, pr) in probs.iter().enumerate() {
            cum += pr;
            if r < cum {
                return c[i].0;
            }
        }
        c.last().map(|x| x.0).unwrap_or(0)
    }
}

/// The candidates' order: higher logit first (`total_cmp`), lower id among equals.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `k` best of `logits` by [`by_logit_desc`] (`0 < k < logits.len()`), in any order, into
/// `out`. One pass: a logit enters a buffer of up to `2k` only if it beats the `k`-th best kept
/// so far, and a full buffer is cut back to its `k` best; the same set as selecting among all.
fn top_k(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.reserve(2 * k);
    let mut worst: Option<(u32, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        let c = (i as u32, l);
        if worst.is_some_and(|w| by_logit_desc(&c, &w).is_ge()) {
            continue;
        }
        out.push(c);
        if out.len() == 2 * k {
            out.select_nth_unstable_by(k - 1, by_logit_desc);
            out.truncate(k);
            worst = out.iter().copied().max_by(by_logit_desc);
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_logit_desc);
        out.truncate(k);
    }
}

/// The first index of the largest logit (the lowest id among equals).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > best.1 {
            best = (i as u32, l);
        }
    }
    best.0
}

/// Probabilities of `logits / temp`, in f64 so long tails still sum to 1.
fn softmax(logits: impl Iterator<Item = f32> + Clone, temp: f32) -> Vec<f64> {
    let t = f64::from(temp);
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        let n = logits.count().max(1);
        return vec![1.0 / n as f64; n];
    }
    let e: Vec<f64> = logits
        .map(|l| ((f64::from(l) - f64::from(max)) / t).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.5, -1.0, 0.5, 2.9]
    }

    /// The one-pass top-k keeps the set a selection among all candidates keeps, ties (equal
    /// logits, infinities) included, for every k.
    #[test]
    fn top_k_is_the_k_best_by_logit_then_id() {
        let mut x: u64 = 99;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for n in [2usize, 7, 100, 1000] {
            // Few distinct values: many ties.
            let logits: Vec<f32> = (0..n)
                .map(|_| match next() % 50 {
                    0 => f32::NEG_INFINITY,
                    1 => f32::INFINITY,
                    v => (v % 13) as f32 - 6.0,
                })
                .collect();
            for k in 1..n {
                let mut all: Vec<(u32, f32)> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l))
                    .collect();
                all.sort_by(by_logit_desc);
                all.truncate(k);
                let mut got = Vec::new();
                top_k(&logits, k, &mut got);
                got.sort_by(by_logit_desc);
                let bits = |v: &[(u32, f32)]| -> Vec<(u32, u32)> {
                    v.iter().map(|&(i, l)| (i, l.to_bits())).collect()
                };
                assert_eq!(bits(&got), bits(&all), "n {n} k {k}");
            }
        }
    }

    #[test]
    fn greedy_picks_the_max() {
        let mut s = Sampler::new(SamplerParams {
            temp: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits()), 1);
        let mut l = logits();
        l[4] = f32::NAN;
        assert_eq!(s.sample(&l), 1, "NaN never wins");
    }

    #[test]
    fn greedy_params_are_greedy() {
        let p = SamplerParams::greedy();
        assert!(p.temp <= 0.0);
        assert_eq!(p.repeat_penalty, 1.0);
        // Hot settings elsewhere do not matter: the argmax wins every time.
        let mut s = Sampler::new(SamplerParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerParams::greedy()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits()), 1);
        }
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut s = Sampler::new(SamplerParams {
            temp: 0.0,
            repeat_penalty: 1.5,
            ..Default::default()
        });
        s.accept(1);
        assert_eq!(s.sample(&logits()), 5);
    }

    /// llama.cpp's penalties: the repetition penalty once per distinct recent token (not once
    /// per occurrence), the frequency penalty times the count, the presence penalty once.
    #[test]
    fn penalties_count_each_recent_token_as_llama_cpp_does() {
        let mut s = Sampler::new(SamplerParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.25,
            presence_penalty: 0.5,
            ..SamplerParams::greedy()
        });
        for t in [1, 1, 1, 3] {
            s.accept(t);
        }
        s.penalized = logits();
        s.penalize();
        let want = [
            1.0,
            3.0 / 2.0 - 3.0 * 0.25 - 0.5,
            2.5,
            -2.0 - 0.25 - 0.5,
            0.5,
            2.9,
        ];
        assert_eq!(s.penalized, want);
        // Tokens leave the window: with repeat_last_n 2 only the last two count.
        let mut s = Sampler::new(SamplerParams {
            repeat_last_n: 2,
            frequency_penalty: 1.0,
            ..SamplerParams::greedy()
        });
        for t in [1, 1, 1, 3] {
            s.accept(t);
        }
        s.penalized = logits();
        s.penalize();
        assert_eq!(s.penalized, [1.0, 2.0, 2.5, -2.0, 0.5, 2.9]);
    }

    #[test]
    fn logit_bias_comes_first_and_minus_infinity_bans() {
        let mut s = Sampler::new(SamplerParams {
            logit_bias: vec![(1, f32::NEG_INFINITY), (4, 2.0), (4, 0.25)],
            ..SamplerParams::greedy()
        });
        // 0.5 + 2.25 = 2.75 < 2.9: token 5 wins once 1 is banned.
        assert_eq!(s.sample(&logits()), 5);
        let mut s = Sampler::new(SamplerParams {
            logit_bias: vec![(4, 3.0), (99, 5.0)],
            ..SamplerParams::greedy()
        });
        assert_eq!(
            s.sample(&logits()),
            4,
            "ids past the vocabulary are no-ops here"
        );
        for bad in [f32::NAN, f32::INFINITY] {
            let p = SamplerParams {
                logit_bias: vec![(0, bad)],
                ..SamplerParams::greedy()
            };
            assert!(p.validate().is_err(), "{bad}");
        }
        let p = SamplerParams {
            frequency_penalty: f32::NAN,
            ..SamplerParams::greedy()
        };
        assert!(p.validate().is_err());
    }

    #[test]
    fn top_k_1_is_greedy_and_seeds_reproduce() {
        let mut s = Sampler::new(SamplerParams {
            top_k: 1,
            temp: 1.0,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits()), 1);
        }
        let draw = |seed| {
            let mut s = Sampler::new(SamplerParams {
                temp: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            });
            (0..32).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(
            draw(7)
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 2,
            "a hot sampler explores"
        );
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // min_p 0.5: only tokens with p >= 0.5 p_max survive: logits within ln 2 of 3.0 → 1, 5, 2.
        let mut s = Sampler::new(SamplerParams {
            temp: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!([1, 5, 2].contains(&s.sample(&logits())));
        }
        // top_p 0.5: p(1) = 0.36 alone is short of 0.5, with p(5) = 0.33 it is past it.
        let mut s = Sampler::new(SamplerParams {
            temp: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        });
        let seen: std::collections::HashSet<u32> = (0..200).map(|_| s.sample(&logits())).collect();
        assert_eq!(seen, [1, 5].into_iter().collect());
    }
}
