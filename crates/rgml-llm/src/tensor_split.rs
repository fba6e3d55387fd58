//! The model's side of tensor parallelism: which weight is split how over the devices of a
//! meta device (`--split-mode tensor`), decided from the weights' roles, never from name
//! patterns in the core.
//!
//! Per block:
//! - attention Q, K, V (and their biases) split by output rows, in whole heads; every device
//!   gets whole KV heads and the query heads that share them (grouped-query attention keeps
//!   each group on one device), and those heads' attention sinks;
//! - FFN gate and up split by output rows; a mixture of experts the same way, every expert
//!   split alike (`ffn_{gate,up}_exps` and their biases by their hidden rows; the router
//!   stays whole, as the routing must);
//! - fused projections (Phi-3's `attn_qkv`, and `ffn_up` holding gate and up) split as their
//!   parts are, one run of the split per part, so each device's rows are its Q, K and V heads
//!   (its gate and up rows) and the views of the parts stay on their devices;
//! - the KV cache split by KV heads;
//! - everything else (norms, embeddings, output) mirrored;
//! - the two projections back to the model width, attention output and FFN down, one of two
//!   ways ([`TensorSync`]):
//!   - [`TensorSync::Reduce`] (Megatron): split on their contraction axis by the same heads /
//!     FFN rows (in whole quantization blocks), so each device's product is a PARTIAL sum that
//!     an all-reduce joins. Two joins per block, but the sums are reassociated: the logits
//!     differ from one device's by rounding, which this model amplifies (0.2-0.3 on the demo
//!     model, the size of llama.cpp's own AVX2 vs AVX-512 spread);
//!   - [`TensorSync::Gather`] (the default): split by output rows (the model width); their
//!     split inputs are all-gathered first and their split outputs after, so every dot
//!     product runs whole on one device in one device's order: the logits equal one device's
//!     bit for bit. Four joins per block, each moving a slice instead of a whole vector.
//!
//! This module owns the arithmetic of those sizes; loading and running the split model is the
//! meta device's and the session's job.

use crate::config::ModelConfig;
use crate::error::{LlmError, Result};
use rgml::meta::{split_sizes, Segment, SplitState};
use std::collections::HashMap;

/// How the projections back to the model width (attention output, FFN down) are split, and so
/// how the devices' work is joined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TensorSync {
    /// By output rows, inputs and outputs all-gathered: bit-identical to one device.
    #[default]
    Gather,
    /// On the contraction axis, partial sums all-reduced: fewer joins, rounding differs.
    Reduce,
}

/// Per-device sizes of a model split over `n` devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSplitPlan {
    /// KV heads per device.
    pub kv_heads: Vec<usize>,
    /// Query heads per device.
    pub q_heads: Vec<usize>,
    /// Query rows (query heads × head size) per device.
    pub q_rows: Vec<usize>,
    /// K / V rows (KV heads × head size) per device.
    pub kv_rows: Vec<usize>,
    /// FFN hidden rows per device (of each expert, where the FFN is a mixture of experts).
    pub ffn_rows: Vec<usize>,
    /// Rows of the model width per device (outputs of the projections split by rows).
    pub embd_rows: Vec<usize>,
    /// Q/K/V and gate/up are fused projections (see [`ModelConfig::fused_projections`]).
    pub fused: bool,
}

impl TensorSplitPlan {
    /// Sizes for `config` over devices weighted by `shares` (empty: even). `ffn_granule`: the
    /// largest block size (in elements) of the FFN down weights, whose contraction axis is
    /// split; head sizes must be whole blocks of the attention output weights
    /// (`attn_granule`).
    pub fn new(
        config: &ModelConfig,
        shares: &[f32],
        n_devices: usize,
        attn_granule: usize,
        ffn_granule: usize,
    ) -> Result<TensorSplitPlan> {
        let shares: Vec<f32> = if shares.is_empty() {
            vec![1.0; n_devices]
        } else if shares.len() == n_devices {
            shares.to_vec()
        } else {
            return Err(LlmError::BadInput(format!(
                "--tensor-split has {} shares for {n_devices} devices",
                shares.len()
            )));
        };
        let c = config;
        if c.n_head_kv == 0 || !c.n_head.is_multiple_of(c.n_head_kv) {
            return Err(LlmError::BadConfig(format!(
                "{} query heads do not group over {} KV heads",
                c.n_head, c.n_head_kv
            )));
        }
        if attn_granule == 0 || !c.head_dim.is_multiple_of(attn_granule) {
            return Err(LlmError::BadConfig(format!(
                "a head of {} cannot be split in blocks of {attn_granule}",
                c.head_dim
            )));
        }
        let group = c.n_head / c.n_head_kv;
        let kv_heads = split_sizes(c.n_head_kv, &shares, 1)?;
        let q_heads: Vec<usize> = kv_heads.iter().map(|h| h * group).collect();
        let q_rows = q_heads.iter().map(|h| h * c.head_dim).collect();
        let kv_rows = kv_heads.iter().map(|h| h * c.head_dim).collect();
        let ffn_width = c.moe.as_ref().map_or(c.n_ff, |m| m.n_ff_exp);
        let ffn_rows = split_sizes(ffn_width, &shares, ffn_granule.max(1))?;
        // Whole 32-element blocks where the width allows (aligned slices), single rows else.
        let embd_granule = if c.n_embd.is_multiple_of(32) { 32 } else { 1 };
        let embd_rows = split_sizes(c.n_embd, &shares, embd_granule)?;
        Ok(TensorSplitPlan {
            kv_heads,
            q_heads,
            q_rows,
            kv_rows,
            ffn_rows,
            embd_rows,
            fused: c.fused_projections(),
        })
    }

    /// The split state of every split tensor of an `n_layer` model by name: the GGUF weights
    /// (`blk.{i}.attn_q.weight`, ...) and the session's KV cache (`cache_k_l{i}` `[n_embd_kv,
    /// cells]` split on axis 0, `cache_v_l{i}` `[cells, n_embd_kv]` on axis 1). Names the file
    /// lacks (biases) are simply never asked for. `sync` picks the projections' split.
    pub fn name_states(&self, n_layer: usize, sync: TensorSync) -> HashMap<String, SplitState> {
        let (attn_output, ffn_down) = match sync {
            TensorSync::Gather => (
                SplitState::axis(1, self.embd_rows.clone()),
                SplitState::axis(1, self.embd_rows.clone()),
            ),
            TensorSync::Reduce => (
                SplitState::axis(0, self.q_rows.clone()),
                SplitState::axis(0, self.ffn_rows.clone()),
            ),
        };
        // Biases of the projections back to the model width: split as their rows where the
        // rows are split, else whole (added once, after the partial sums are joined).
        let width_bias = match sync {
            TensorSync::Gather => SplitState::axis(0, self.embd_rows.clone()),
            TensorSync::Reduce => SplitState::Mirrored,
        };
        let mut out = HashMap::new();
        for il in 0..n_layer {
            let mut put = |name: &str, state: SplitState| {
                out.insert(format!("blk.{il}.{name}"), state);
            };
            put("attn_q.weight", SplitState::axis(1, self.q_rows.clone()));
            put("attn_k.weight", SplitState::axis(1, self.kv_rows.clone()));
            put("attn_v.weight", SplitState::axis(1, self.kv_rows.clone()));
            put("attn_output.weight", attn_output.clone());
            put("attn_output.bias", width_bias.clone());
            put(
                "attn_sinks.weight",
                SplitState::axis(0, self.q_heads.clone()),
            );
            put("attn_q.bias", SplitState::axis(0, self.q_rows.clone()));
            put("attn_k.bias", SplitState::axis(0, self.kv_rows.clone()));
            put("attn_v.bias", SplitState::axis(0, self.kv_rows.clone()));
            put(
                "ffn_gate.weight",
                SplitState::axis(1, self.ffn_rows.clone()),
            );
            if self.fused {
                put(
                    "attn_qkv.weight",
                    self.runs(&[&self.q_rows, &self.kv_rows, &self.kv_rows]),
                );
                put(
                    "ffn_up.weight",
                    self.runs(&[&self.ffn_rows, &self.ffn_rows]),
                );
            } else {
                put("ffn_up.weight", SplitState::axis(1, self.ffn_rows.clone()));
            }
            put("ffn_down.weight", ffn_down.clone());
            put(
                "ffn_gate_exps.weight",
                SplitState::axis(1, self.ffn_rows.clone()),
            );
            put(
                "ffn_up_exps.weight",
                SplitState::axis(1, self.ffn_rows.clone()),
            );
            put("ffn_down_exps.weight", ffn_down.clone());
            for bias in ["ffn_gate_exps.bias", "ffn_up_exps.bias"] {
                put(bias, SplitState::axis(0, self.ffn_rows.clone()));
            }
            put("ffn_down_exps.bias", width_bias.clone());
            out.insert(
                format!("cache_k_l{il}"),
                SplitState::axis(0, self.kv_rows.clone()),
            );
            out.insert(
                format!("cache_v_l{il}"),
                SplitState::axis(1, self.kv_rows.clone()),
            );
        }
        out
    }
}

impl TensorSplitPlan {
    /// A fused weight's split by output rows (axis 1): one run per part, of the part's sizes.
    fn runs(&self, parts: &[&Vec<usize>]) -> SplitState {
        SplitState::Axis {
            axis: 1,
            segments: parts
                .iter()
                .map(|sizes| Segment {
                    sizes: sizes.to_vec(),
                    repeat: 1,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm() -> ModelConfig {
        crate::config::smollm_config()
    }

    #[test]
    fn heads_stay_whole_and_grouped() {
        let c = smollm();
        let p = TensorSplitPlan::new(&c, &[], 2, 32, 32).unwrap();
        assert_eq!(p.kv_heads, vec![2, 1]);
        assert_eq!(p.q_rows, vec![384, 192]);
        assert_eq!(p.kv_rows, vec![128, 64]);
        assert_eq!(p.ffn_rows, vec![768, 768]);
        let p = TensorSplitPlan::new(&c, &[1.0, 1.0, 1.0], 3, 32, 256).unwrap();
        assert_eq!(p.kv_heads, vec![1, 1, 1]);
        assert_eq!(p.q_rows, vec![192; 3]);
        assert_eq!(p.ffn_rows, vec![512, 512, 512]);
        assert!(p.ffn_rows.iter().all(|r| r % 256 == 0));
        // Uneven shares; more devices than KV heads leaves some without attention.
        let p = TensorSplitPlan::new(&c, &[3.0, 1.0], 2, 32, 32).unwrap();
        assert_eq!(p.kv_heads, vec![2, 1]);
        assert_eq!(p.ffn_rows, vec![1152, 384]);
        let p = TensorSplitPlan::new(&c, &[], 4, 32, 32).unwrap();
        assert_eq!(p.kv_heads.iter().sum::<usize>(), 3);
        assert!(p.kv_heads.contains(&0));
        assert_eq!(p.q_rows.iter().sum::<usize>(), c.n_embd);
        assert_eq!(p.ffn_rows.iter().sum::<usize>(), c.n_ff);
    }

    #[test]
    fn weights_get_their_roles_states() {
        let c = smollm();
        let p = TensorSplitPlan::new(&c, &[], 2, 32, 32).unwrap();
        let s = p.name_states(2, TensorSync::Reduce);
        let w = |name: &str| s[&format!("blk.1.{name}")].clone();
        assert_eq!(w("attn_q.weight"), SplitState::axis(1, vec![384, 192]));
        assert_eq!(w("attn_k.weight"), SplitState::axis(1, vec![128, 64]));
        assert_eq!(w("attn_output.weight"), SplitState::axis(0, vec![384, 192]));
        assert_eq!(w("attn_q.bias"), SplitState::axis(0, vec![384, 192]));
        assert_eq!(w("ffn_up.weight"), SplitState::axis(1, vec![768, 768]));
        assert_eq!(w("ffn_down.weight"), SplitState::axis(0, vec![768, 768]));
        // Norms are mirrored: not in the map.
        assert!(
            !s.contains_key("blk.0.attn_norm.weight") && !s.contains_key("blk.0.ffn_norm.weight")
        );
        // Per layer: q, k, v, output, four biases, the sinks, gate, up, down (dense and
        // experts), the experts' three biases, and the two caches.
        assert_eq!(s.len(), 2 * 20);
        // A head's sink goes with its head; biases of the reduced projections stay whole.
        assert_eq!(w("attn_sinks.weight"), SplitState::axis(0, vec![6, 3]));
        assert_eq!(w("attn_output.bias"), SplitState::Mirrored);
        assert_eq!(w("ffn_up_exps.bias"), SplitState::axis(0, vec![768, 768]));
        assert_eq!(w("ffn_down_exps.bias"), SplitState::Mirrored);
        let gather = p.name_states(2, TensorSync::Gather);
        let embd = SplitState::axis(0, p.embd_rows.clone());
        assert_eq!(gather["blk.0.attn_output.bias"], embd);
        assert_eq!(gather["blk.0.ffn_down_exps.bias"], embd);
        assert_eq!(s["cache_k_l0"], SplitState::axis(0, vec![128, 64]));
        assert_eq!(s["cache_v_l1"], SplitState::axis(1, vec![128, 64]));
        assert!(!s.contains_key("blk.2.attn_q.weight"));
        // Gather: the projections split by output rows of the width, in whole blocks.
        assert_eq!(p.embd_rows, vec![288, 288]);
        let g = p.name_states(2, TensorSync::Gather);
        assert_eq!(
            g["blk.0.attn_output.weight"],
            SplitState::axis(1, vec![288, 288])
        );
        assert_eq!(
            g["blk.1.ffn_down.weight"],
            SplitState::axis(1, vec![288, 288])
        );
        assert_eq!(g["blk.1.attn_q.weight"], s["blk.1.attn_q.weight"]);
        let p3 = TensorSplitPlan::new(&c, &[1.0, 2.0, 1.0], 3, 32, 32).unwrap();
        assert_eq!(p3.embd_rows.iter().sum::<usize>(), c.n_embd);
        assert!(p3.embd_rows.iter().all(|r| r % 32 == 0));
    }

    #[test]
    fn experts_split_by_their_hidden_rows_and_the_router_stays_whole() {
        let mut c = smollm();
        c.moe = Some(crate::config::MoeConfig {
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 512,
            norm_weights: true,
            gating: crate::config::ExpertGating::Softmax,
            n_ff_shexp: 0,
        });
        let p = TensorSplitPlan::new(&c, &[], 2, 32, 256).unwrap();
        assert_eq!(p.ffn_rows, vec![256, 256]);
        let s = p.name_states(1, TensorSync::Reduce);
        let rows = SplitState::axis(1, vec![256, 256]);
        assert_eq!(s["blk.0.ffn_gate_exps.weight"], rows);
        assert_eq!(s["blk.0.ffn_up_exps.weight"], rows);
        assert_eq!(
            s["blk.0.ffn_down_exps.weight"],
            SplitState::axis(0, vec![256, 256])
        );
        assert!(!s.contains_key("blk.0.ffn_gate_inp.weight"));
        let g = p.name_states(1, TensorSync::Gather);
        assert_eq!(g["blk.0.ffn_down_exps.weight"], g["blk.0.ffn_down.weight"]);
    }

    #[test]
    fn bad_splits_are_errors() {
        let c = smollm();
        assert!(TensorSplitPlan::new(&c, &[1.0], 2, 32, 32).is_err());
        assert!(TensorSplitPlan::new(&c, &[1.0, f32::NAN], 2, 32, 32).is_err());
        // A 1536-row FFN is no whole number of 1000-element blocks.
        assert!(TensorSplitPlan::new(&c, &[], 2, 32, 1000).is_err());
        assert!(TensorSplitPlan::new(&c, &[], 2, 48, 32).is_err());
        let mut odd = c.clone();
        odd.n_head_kv = 2;
        assert!(TensorSplitPlan::new(&odd, &[], 2, 32, 32).is_err());
    }
}
