//! The model's side of tensor parallelism: which weight is split how over the devices of a
//! meta device (`--split-mode tensor`), decided from the weights' roles, never from name
//! patterns in the core.
//!
//! Per block (each block its own sizes, where blocks differ as Gemma 4's do):
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
    /// Per layer, its heads' and dense FFN's sizes (layers differ in Gemma 4).
    pub layers: Vec<LayerSplit>,
    /// Hidden rows of each expert per device, where the model has experts.
    pub expert_rows: Vec<usize>,
    /// Rows of the model width per device (outputs of the projections split by rows).
    pub embd_rows: Vec<usize>,
    /// Q/K/V and gate/up are fused projections (see [`ModelConfig::fused_projections`]).
    pub fused: bool,
}

/// One layer's per-device sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSplit {
    /// KV heads per device.
    pub kv_heads: Vec<usize>,
    /// Query heads per device.
    pub q_heads: Vec<usize>,
    /// Query rows (query heads × head size) per device.
    pub q_rows: Vec<usize>,
    /// K / V rows (KV heads × head size) per device.
    pub kv_rows: Vec<usize>,
    /// Dense FFN hidden rows per device (empty where the layer has no dense FFN).
    pub ffn_rows: Vec<usize>,
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
        let layers = (0..c.n_layer)
            .map(|il| layer_split(c, il, &shares, attn_granule, ffn_granule))
            .collect::<Result<Vec<_>>>()?;
        let expert_rows = match &c.moe {
            Some(m) => split_sizes(m.n_ff_exp, &shares, ffn_granule.max(1))?,
            None => Vec::new(),
        };
        // Whole 32-element blocks where the width allows (aligned slices), single rows else.
        let embd_granule = if c.n_embd.is_multiple_of(32) { 32 } else { 1 };
        let embd_rows = split_sizes(c.n_embd, &shares, embd_granule)?;
        Ok(TensorSplitPlan {
            layers,
            expert_rows,
            embd_rows,
            fused: c.fused_projections(),
        })
    }

    /// The split state of every split tensor of an `n_layer` model by name: the GGUF weights
    /// (`blk.{i}.attn_q.weight`, ...) and the session's KV cache (`cache_k_l{i}` `[n_embd_kv,
    /// cells]` split on axis 0, `cache_v_l{i}` `[cells, n_embd_kv]` on axis 1). Names the file
    /// lacks (biases, the caches of layers that share another's) are simply never asked for.
    /// `sync` picks the projections' split.
    pub fn name_states(&self, n_layer: usize, sync: TensorSync) -> HashMap<String, SplitState> {
        let mut out = HashMap::new();
        for (il, l) in self.layers.iter().enumerate().take(n_layer) {
            for (name, state) in self.layer_states(l, sync) {
                out.insert(format!("blk.{il}.{name}"), state);
            }
            out.insert(
                format!("cache_k_l{il}"),
                SplitState::axis(0, l.kv_rows.clone()),
            );
            out.insert(
                format!("cache_v_l{il}"),
                SplitState::axis(1, l.kv_rows.clone()),
            );
        }
        out
    }

    /// The split states of one layer's weights, by their names within the block.
    fn layer_states(&self, l: &LayerSplit, sync: TensorSync) -> Vec<(&'static str, SplitState)> {
        let width = || SplitState::axis(1, self.embd_rows.clone());
        // The projections back to the model width: by output rows, or on their contraction
        // axis (the attention's query rows, the FFN's hidden rows).
        let back = |rows: &Vec<usize>| match sync {
            TensorSync::Gather => width(),
            TensorSync::Reduce => SplitState::axis(0, rows.clone()),
        };
        // Biases of the projections back to the model width: split as their rows where the
        // rows are split, else whole (added once, after the partial sums are joined).
        let width_bias = match sync {
            TensorSync::Gather => SplitState::axis(0, self.embd_rows.clone()),
            TensorSync::Reduce => SplitState::Mirrored,
        };
        let rows = |r: &Vec<usize>| SplitState::axis(1, r.clone());
        let mut out = vec![
            ("attn_q.weight", rows(&l.q_rows)),
            ("attn_k.weight", rows(&l.kv_rows)),
            ("attn_v.weight", rows(&l.kv_rows)),
            ("attn_output.weight", back(&l.q_rows)),
            ("attn_output.bias", width_bias.clone()),
            ("attn_sinks.weight", SplitState::axis(0, l.q_heads.clone())),
            ("attn_q.bias", SplitState::axis(0, l.q_rows.clone())),
            ("attn_k.bias", SplitState::axis(0, l.kv_rows.clone())),
            ("attn_v.bias", SplitState::axis(0, l.kv_rows.clone())),
        ];
        if self.fused {
            let qkv = self.runs(&[&l.q_rows, &l.kv_rows, &l.kv_rows]);
            out.push(("attn_qkv.weight", qkv));
        }
        if !l.ffn_rows.is_empty() {
            out.push(("ffn_gate.weight", rows(&l.ffn_rows)));
            let up = match self.fused {
                true => self.runs(&[&l.ffn_rows, &l.ffn_rows]),
                false => rows(&l.ffn_rows),
            };
            out.extend([
                ("ffn_up.weight", up),
                ("ffn_down.weight", back(&l.ffn_rows)),
            ]);
        }
        let x = &self.expert_rows;
        if !x.is_empty() {
            out.extend([
                ("ffn_gate_exps.weight", rows(x)),
                ("ffn_up_exps.weight", rows(x)),
                ("ffn_gate_up_exps.weight", self.runs(&[x, x])),
                ("ffn_down_exps.weight", back(x)),
                ("ffn_gate_exps.bias", SplitState::axis(0, x.clone())),
                ("ffn_up_exps.bias", SplitState::axis(0, x.clone())),
                ("ffn_down_exps.bias", width_bias),
            ]);
        }
        out
    }
}

/// Layer `il`'s sizes: whole KV heads with the query heads that share them, and the dense
/// FFN's hidden rows.
fn layer_split(
    c: &ModelConfig,
    il: usize,
    shares: &[f32],
    attn_granule: usize,
    ffn_granule: usize,
) -> Result<LayerSplit> {
    let h = c.heads(il);
    if h.n_head_kv == 0 || !h.n_head.is_multiple_of(h.n_head_kv) {
        return Err(LlmError::BadConfig(format!(
            "{} query heads do not group over {} KV heads",
            h.n_head, h.n_head_kv
        )));
    }
    if attn_granule == 0 || !h.head_dim.is_multiple_of(attn_granule) {
        return Err(LlmError::BadConfig(format!(
            "a head of {} cannot be split in blocks of {attn_granule}",
            h.head_dim
        )));
    }
    let group = h.n_head / h.n_head_kv;
    let kv_heads = split_sizes(h.n_head_kv, shares, 1)?;
    let q_heads: Vec<usize> = kv_heads.iter().map(|n| n * group).collect();
    let ffn_rows = match c.n_ff_at(il) {
        0 => Vec::new(),
        n_ff => split_sizes(n_ff, shares, ffn_granule.max(1))?,
    };
    Ok(LayerSplit {
        q_rows: q_heads.iter().map(|n| n * h.head_dim).collect(),
        kv_rows: kv_heads.iter().map(|n| n * h.head_dim).collect(),
        kv_heads,
        q_heads,
        ffn_rows,
    })
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
        assert_eq!(p.layers[0].kv_heads, vec![2, 1]);
        assert_eq!(p.layers[0].q_rows, vec![384, 192]);
        assert_eq!(p.layers[0].kv_rows, vec![128, 64]);
        assert_eq!(p.layers[0].ffn_rows, vec![768, 768]);
        let p = TensorSplitPlan::new(&c, &[1.0, 1.0, 1.0], 3, 32, 256).unwrap();
        assert_eq!(p.layers[0].kv_heads, vec![1, 1, 1]);
        assert_eq!(p.layers[0].q_rows, vec![192; 3]);
        assert_eq!(p.layers[0].ffn_rows, vec![512, 512, 512]);
        assert!(p.layers[0].ffn_rows.iter().all(|r| r % 256 == 0));
        // Uneven shares; more devices than KV heads leaves some without attention.
        let p = TensorSplitPlan::new(&c, &[3.0, 1.0], 2, 32, 32).unwrap();
        assert_eq!(p.layers[0].kv_heads, vec![2, 1]);
        assert_eq!(p.layers[0].ffn_rows, vec![1152, 384]);
        let p = TensorSplitPlan::new(&c, &[], 4, 32, 32).unwrap();
        assert_eq!(p.layers[0].kv_heads.iter().sum::<usize>(), 3);
        assert!(p.layers[0].kv_heads.contains(&0));
        assert_eq!(p.layers[0].q_rows.iter().sum::<usize>(), c.n_embd);
        assert_eq!(p.layers[0].ffn_rows.iter().sum::<usize>(), c.n_ff);
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
        // Per layer: q, k, v, output, four biases, the sinks, gate, up, down, and the two
        // caches (a dense model: no experts' names).
        assert_eq!(s.len(), 2 * 14);
        // A head's sink goes with its head; biases of the reduced projections stay whole.
        assert_eq!(w("attn_sinks.weight"), SplitState::axis(0, vec![6, 3]));
        assert_eq!(w("attn_output.bias"), SplitState::Mirrored);
        let gather = p.name_states(2, TensorSync::Gather);
        let embd = SplitState::axis(0, p.embd_rows.clone());
        assert_eq!(gather["blk.0.attn_output.bias"], embd);
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
        assert_eq!(p.expert_rows, vec![256, 256]);
        let s = p.name_states(1, TensorSync::Reduce);
        let rows = SplitState::axis(1, vec![256, 256]);
        assert_eq!(s["blk.0.ffn_gate_exps.weight"], rows);
        assert_eq!(s["blk.0.ffn_up_exps.weight"], rows);
        assert_eq!(
            s["blk.0.ffn_down_exps.weight"],
            SplitState::axis(0, vec![256, 256])
        );
        assert!(!s.contains_key("blk.0.ffn_gate_inp.weight"));
        // Fused gate and up: one run of each expert's hidden rows per part.
        let runs = p.runs(&[&p.expert_rows, &p.expert_rows]);
        assert_eq!(s["blk.0.ffn_gate_up_exps.weight"], runs);
        // Biases of the reduced projections stay whole.
        assert_eq!(
            s["blk.0.ffn_up_exps.bias"],
            SplitState::axis(0, vec![256, 256])
        );
        assert_eq!(s["blk.0.ffn_down_exps.bias"], SplitState::Mirrored);
        let g = p.name_states(1, TensorSync::Gather);
        assert_eq!(g["blk.0.ffn_down_exps.weight"], g["blk.0.ffn_down.weight"]);
        let embd = SplitState::axis(0, p.embd_rows.clone());
        assert_eq!(g["blk.0.ffn_down_exps.bias"], embd);
    }

    /// Gemma 4: local layers of 8 KV heads of 256, global ones of 2 of 512, FFNs of two
    /// widths; each layer splits its own heads and rows.
    #[test]
    fn layers_of_different_shapes_split_each_their_own() {
        let mut c = smollm();
        c.n_layer = 2;
        c.layer_heads = Some(vec![
            crate::config::LayerHeads {
                n_head: 16,
                n_head_kv: 8,
                head_dim: 256,
                n_rot: 256,
            },
            crate::config::LayerHeads {
                n_head: 16,
                n_head_kv: 2,
                head_dim: 512,
                n_rot: 512,
            },
        ]);
        c.layer_n_ff = Some(vec![1536, 3072]);
        let p = TensorSplitPlan::new(&c, &[], 2, 32, 32).unwrap();
        let (local, global) = (&p.layers[0], &p.layers[1]);
        assert_eq!(local.kv_rows, vec![4 * 256, 4 * 256]);
        assert_eq!(local.q_rows, vec![8 * 256, 8 * 256]);
        assert_eq!(global.kv_rows, vec![512, 512]);
        assert_eq!(global.q_rows, vec![8 * 512, 8 * 512]);
        assert_eq!(global.ffn_rows, vec![1536, 1536]);
        let s = p.name_states(2, TensorSync::Gather);
        assert_eq!(s["cache_k_l1"], SplitState::axis(0, vec![512, 512]));
        assert_eq!(
            s["blk.0.attn_q.weight"],
            SplitState::axis(1, vec![2048, 2048])
        );
        assert_eq!(
            s["blk.1.ffn_up.weight"],
            SplitState::axis(1, vec![1536, 1536])
        );
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
