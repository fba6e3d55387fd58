//! ROPE: rotary position embedding in Normal (adjacent pairs) and NeoX (half-split pairs)
//! layouts, with ggml's YaRN (`rope_yarn`): `theta_scale = freq_base^(-2/n_dims)`, the
//! interpolation/extrapolation ramp between the correction dims, and the magnitude scale.
//! Optional frequency factors (src2, Llama 3's `rope_freqs`) divide each pair's angle before
//! YaRN, as ggml's `ggml_rope_cache_init` does. Dimensions from `n_dims` on are copied through.
//! The multi-section modes (ggml's MROPE and IMROPE, text form) rotate NeoX pairs, each by one
//! of its token's four positions ([`rgml::RopeMode::position_of_pair`]), with one running
//! angle product per position as `ggml_mrope_cache_init` keeps them.
//!
//! The f32 operations are those of ggml-cpu's compiled code, GCC's fused multiply-adds included
//! ([`rotate`], [`fused_pairs`], [`yarn_mix`]); `tests/ggml_rope.rs` checks them against ggml's
//! own output.

use crate::kernels::task;
use crate::kernels::task::{
    f32_row, f32_row_for_write, f32_row_mut, scratch_slice, NodeTask, ThreadCtx,
};
use rgml::{Result, RopeMode, RopeParams};

/// YaRN correction dim for `n_rot` rotations (ggml's `ggml_rope_yarn_corr_dim`).
fn corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// The `[start, end]` correction dims (ggml's `ggml_rope_yarn_corr_dims`).
pub(crate) fn corr_dims(p: &RopeParams) -> [f32; 2] {
    let start = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// Rotate the pair `(x0, x1)` by the angle with cosine `c` and sine `s`. ggml's C code is
/// `x0*c - x1*s`, `x0*s + x1*c`; GCC contracts the first product of each into a fused
/// multiply-add (verified bit for bit against llama.cpp's x86 build), so this does the same.
#[inline(always)]
fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> [f32; 2] {
    [x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c)]
}

/// [`rotate`] with every product rounded: how ggml rotates the Normal-mode pairs that its
/// vectorized loop leaves over (see [`fused_pairs`]).
#[inline(always)]
fn rotate_unfused(x0: f32, x1: f32, c: f32, s: f32) -> [f32; 2] {
    [x0 * c - x1 * s, x0 * s + x1 * c]
}

/// How many leading pairs of a Normal-mode row ggml rotates with fused multiply-adds. GCC
/// vectorizes its loop over adjacent pairs: whole vectors use `vfmaddsub` (fused, as
/// [`rotate`]); the last vector step holds two pairs in the AVX2 builds (128-bit, after any
/// 256-bit steps) and four in the AVX-512 build (256-bit, after 512-bit steps), and the pairs
/// left over, as all pairs of a row with fewer than four (AVX-512), go through a two-lane
/// `vmulps` / `vaddsubps` block: [`rotate_unfused`]. NeoX pairs are never vectorized: all fused.
/// Read from GCC 12's code for llama.cpp's native (Zen 1), `GGML_NATIVE=OFF` AVX2 and AVX-512
/// builds; the native build's is checked against its output in `tests/ggml_rope.rs`.
fn fused_pairs(n_pairs: usize, wide: bool) -> usize {
    let group = if wide { 4 } else { 2 };
    n_pairs - n_pairs % group
}

/// YaRN's angle, ggml's `theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix`: GCC
/// contracts the first product and the sum into a fused multiply-add (read from the
/// disassembly of llama.cpp's x86 build, and checked against its output in
/// `tests/ggml_rope.rs`).
#[inline(always)]
fn yarn_mix(theta_interp: f32, theta_extrap: f32, mix: f32) -> f32 {
    theta_interp.mul_add(1.0 - mix, theta_extrap * mix)
}

/// YaRN's magnitude correction, ggml's `1.0f + 0.1f * logf(1.0f / freq_scale)`, which GCC
/// contracts into one fused multiply-add.
fn yarn_mscale(freq_scale: f32) -> f32 {
    0.1f32.mul_add((1.0 / freq_scale).ln(), 1.0)
}

/// Fill `cache[i0] = cos`, `cache[i0 + 1] = sin` for the pairs of a token at positions `pos`
/// (the first alone in the one-position modes), pair `k`'s angle divided by `freq_factors[k]`
/// when there are factors.
fn fill_cache(
    cache: &mut [f32],
    pos: [f32; 4],
    p: &RopeParams,
    corr: [f32; 2],
    theta_scale: f32,
    freq_factors: Option<&[f32]>,
) {
    // As ggml: the running products (one per position, as `ggml_mrope_cache_init` keeps
    // `theta_t`, `theta_h`, `theta_w`, `theta_e`) stay undivided and `theta / ff` (one f32
    // division; without factors `ff = 1`, which is exact) is the extrapolated angle. The caller
    // passes n_dims / 2 factors, one per pair.
    let mut theta_base = pos;
    for (k, pair) in cache.chunks_exact_mut(2).enumerate() {
        let i0 = 2 * k;
        let ff = freq_factors.and_then(|f| f.get(k)).copied().unwrap_or(1.0);
        let theta_extrap = theta_base[p.mode.position_of_pair(k).min(3)] / ff;
        let theta_interp = p.freq_scale * theta_extrap;
        let mut theta = theta_interp;
        let mut mscale = p.attn_factor;
        if p.ext_factor != 0.0 {
            let mix = ramp(corr[0], corr[1], i0) * p.ext_factor;
            theta = yarn_mix(theta_interp, theta_extrap, mix);
            mscale *= yarn_mscale(p.freq_scale);
        }
        pair[0] = theta.cos() * mscale;
        pair[1] = theta.sin() * mscale;
        for t in &mut theta_base {
            *t *= theta_scale;
        }
    }
}

/// The positions of token `i2` of `n_tokens`, as ggml lays out the multi-section modes' four
/// (`pos[i2 + j·n_tokens]`); the one position of the other modes in every slot.
///
/// # Safety
/// `pos` must point at `n_tokens` dense I32 values, `4 n_tokens` for a multi-section `mode`.
unsafe fn token_positions(pos: *const u8, i2: usize, n_tokens: usize, mode: RopeMode) -> [f32; 4] {
    let at = |j: usize| {
        // SAFETY: `i2 + j·n_tokens` is below the count the caller promises (`j` is 0 in the
        // one-position modes).
        unsafe { pos.cast::<i32>().add(i2 + j * n_tokens).read_unaligned() as f32 }
    };
    match mode.positions_per_token() {
        4 => [at(0), at(1), at(2), at(3)],
        _ => [at(0); 4],
    }
}

/// ROPE of src0 `[ne0, heads, tokens, ne3]` at the I32 positions of src1 (one per `ne2`), with
/// the optional f32 frequency factors of src2 (the first `n_dims / 2` values).
pub(crate) fn rope(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &RopeParams) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if task.features.has_avx2() {
        // SAFETY: the node's features say the CPU has FMA (with AVX2 and F16C).
        return unsafe { rope_fma(task, tc, p) };
    }
    rope_rows(task, tc, p)
}

/// [`rope_rows`] compiled with FMA: `mul_add` becomes one instruction instead of a call to
/// the runtime's `fmaf`; the arithmetic (a fused multiply-add either way) is the same.
///
/// # Safety
/// The CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rope_fma(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &RopeParams) -> Result<()> {
    rope_rows(task, tc, p)
}

#[inline(always)]
fn rope_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &RopeParams) -> Result<()> {
    let (dst, a, pos) = (&task.dst, task.src(0)?, task.src(1)?);
    let ne0 = dst.ne[0];
    let n_dims = p.n_dims.min(ne0) & !1;
    let theta_scale = p.freq_base.powf(-2.0 / n_dims.max(1) as f32);
    let corr = corr_dims(p);
    let freq_factors = task.src.get(2).and_then(Option::as_ref).map(|ff| {
        // SAFETY: the support check requires src2 to be F32 with dense rows of at least
        // n_dims / 2 values (its first row is read), and the plan refuses one that overlaps the
        // destination (the only memory the node writes), so nobody writes them meanwhile.
        unsafe { f32_row(ff.ptr, n_dims / 2) }
    });
    let (cache, rest) = tc.scratch.split_at_mut(n_dims.min(tc.scratch.len()));
    let cache = scratch_slice(cache, n_dims)?;
    let mut cached: Option<usize> = None;
    for r in task::split(dst.nrows(), tc.ith, tc.nth) {
        let (i1, i2, i3) = dst.row_index(r);
        if cached != Some(i2) {
            // SAFETY: `pos` is a dense I32 vector with at least `ne2` entries, `4 ne2` in the
            // multi-section modes (support table).
            let pi = unsafe { token_positions(pos.ptr, i2, dst.ne[2], p.mode) };
            fill_cache(cache, pi, p, corr, theta_scale, freq_factors);
            cached = Some(i2);
        }
        let drow = dst.row(i1, i2, i3);
        // SAFETY: dense F32 rows of in-bounds indices; the destination row belongs to this
        // thread and an overlapping source row is copied to scratch first.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, rest)?;
            let d = f32_row_mut(drow, ne0);
            match p.mode {
                RopeMode::Normal => {
                    let fused = fused_pairs(n_dims / 2, task.features.wide());
                    for (k, ((dp, xp), cs)) in d[..n_dims]
                        .chunks_exact_mut(2)
                        .zip(x[..n_dims].chunks_exact(2))
                        .zip(cache.chunks_exact(2))
                        .enumerate()
                    {
                        [dp[0], dp[1]] = if k < fused {
                            rotate(xp[0], xp[1], cs[0], cs[1])
                        } else {
                            rotate_unfused(xp[0], xp[1], cs[0], cs[1])
                        };
                    }
                }
                RopeMode::Neox | RopeMode::Mrope { .. } | RopeMode::Imrope { .. } => {
                    let half = n_dims / 2;
                    let (d0, d1) = d[..n_dims].split_at_mut(half);
                    let (x0, x1) = x[..n_dims].split_at(half);
                    for k in 0..half {
                        let (c, s) = (cache[2 * k], cache[2 * k + 1]);
                        [d0[k], d1[k]] = rotate(x0[k], x1[k], c, s);
                    }
                }
            }
            d[n_dims..].copy_from_slice(&x[n_dims..]);
        }
    }
    Ok(())
}
