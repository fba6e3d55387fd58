//! Choosing the next token from logits: repetition penalty, top-k, top-p, min-p, temperature,
//! then a seeded draw — llama.cpp's default sampler chain, in that order — or greedy argmax
//! when the temperature is 0.

use crate::error::{LlmError, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

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
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
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
    /// `min_p` in [0, 1], `repeat_penalty` finite and above 0. Outside them sampling would
    /// not fail but silently degenerate (NaN probabilities, nothing or everything kept).
    pub fn validate(&self) -> Result<()> {
        let checks: [(&'static str, f32, bool, &'static str); 4] = [
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
        ];
        match checks.into_iter().find(|check| !check.2) {
            Some((name, value, _, range)) => Err(LlmError::InvalidSampler { name, value, range }),
            None => Ok(()),
        }
    }
}

/// A stateful sampler (remembers recent tokens for the penalty, owns the random stream).
///
/// `Send`: one per sequence, used by whichever thread drives that sequence.
#[derive(Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: StdRng,
    recent: VecDeque<u32>,
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
            candidates: Vec::new(),
            penalized: Vec::new(),
        }
    }

    /// Remember `token` as generated or given (for the repetition penalty).
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
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
        if p.repeat_penalty != 1.0 {
            for &t in &self.recent {
                if let Some(l) = self.penalized.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repeat_penalty
                    } else {
                        *l * p.repeat_penalty
                    };
                }
            }
        }
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
