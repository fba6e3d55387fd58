//! The recurrent layers' ops: SSM_CONV (Mamba's and delta-net's short causal convolution) and
//! GATED_DELTA_NET (Qwen3.5's and Kimi's linear attention), each with ggml-cpu's float
//! operations in ggml-cpu's order (`ggml_compute_forward_ssm_conv_f32`,
//! `ggml_compute_forward_gated_delta_net_one_chunk`), checked bit for bit against its AVX2 and
//! AVX-512 builds in `tests/ggml_recurrent.rs`. This module owns their support checks, scratch
//! sizes and kernels.
//!
//! - SSM_CONV: each output is one dot of a channel's window with its kernel, an f32 sum that
//!   GCC vectorizes without reassociating, as `ggml_vec_dot_f32`'s leftovers ([`leftovers_f32`]:
//!   rounded products in order, the tail by FMA; 4-lane groups in the AVX2 builds, 8 in the
//!   AVX-512 one).
//! - GATED_DELTA_NET: per head and sequence, the state (stored transposed, row `j` is column
//!   `j` of `S`) decays by `expf(g)` (libm, one per token, or per row of `S` for a vector gate),
//!   `delta[j] = (v[j] - row_j·k) · beta` and `o[j] = (row_j·q) · scale` are `ggml_vec_dot_f32`s
//!   ([`vec_dot`]'s F32 flavour), and `row_j += k · delta[j]` is `ggml_vec_mad_f32`, one FMA
//!   per element in both builds (vector body and scalar tail alike).
//!
//! Threads split SSM_CONV into ranges of channels and take GATED_DELTA_NET's (head, sequence)
//! units from the node's counter; no sum crosses a channel or a unit, so the bits do not
//! depend on the split.

use crate::kernels::dots::float::{leftovers_f32, vec_dot, Flavor};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::fma_axpy;
use crate::kernels::task::{self, f32_row, f32_row_mut, scratch_slice};
use crate::kernels::task::{NodeTask, TensorView, ThreadCtx};
use rgml::{DType, Result, Tensor};

fn f32_rows(t: &Tensor) -> bool {
    t.dtype == DType::F32 && t.rows_contiguous()
}

/// Whether the SSM_CONV kernel takes `t` of window `sx` and kernel `c` (`s`): f32 with dense
/// rows, and ggml's shapes (every window the kernel reads lies in `sx`).
pub(crate) fn ssm_conv_supported(t: &Tensor, s: &[&Tensor]) -> bool {
    let [sx, c] = s else {
        return false;
    };
    [*sx, *c, t].into_iter().all(f32_rows) && rgml::op::ssm_conv_shapes(t, sx, c)
}

/// Whether the GATED_DELTA_NET kernel takes `t` of sources `s` (q, k, v, g, beta, state) with
/// `snapshots` states: the shapes [`rgml::Context::gated_delta_net`] builds, f32, the layouts
/// the kernel reads (dense rows of q, k, v and g; a contiguous state; a contiguous result).
pub(crate) fn delta_net_supported(t: &Tensor, s: &[&Tensor], snapshots: usize) -> bool {
    let [q, k, v, g, beta, state] = s else {
        return false;
    };
    s.iter().all(|x| f32_rows(x))
        && t.dtype == DType::F32
        && t.is_contiguous()
        && state.is_contiguous()
        && rgml::op::gated_delta_net_shapes(t, [q, k, v, g, beta, state], snapshots)
}

/// Per-thread scratch of GATED_DELTA_NET over rows of `s_v` values, in f32s: ggml's `delta`
/// row, and with more than one snapshot the working state.
pub(crate) fn delta_net_scratch(s_v: usize, snapshots: usize) -> Option<usize> {
    let state = if snapshots > 1 {
        s_v.checked_mul(s_v)?
    } else {
        0
    };
    s_v.checked_add(state)
}

/// SSM_CONV of window `sx` (src0) and kernel `c` (src1).
pub(crate) fn ssm_conv(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if task.features.has_avx2() {
        // SAFETY: the node's features say the CPU has FMA (with AVX2).
        return unsafe { ssm_conv_fma(task, tc) };
    }
    ssm_conv_channels(task, tc)
}

/// [`ssm_conv_channels`] compiled with FMA (the tail's `mul_add` is one instruction, not a
/// call of the runtime's `fmaf`; the same arithmetic).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn ssm_conv_fma(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    ssm_conv_channels(task, tc)
}

#[inline(always)]
fn ssm_conv_channels(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, sx, c) = (&task.dst, task.src(0)?, task.src(1)?);
    let d_conv = c.ne[0];
    let wide = task.features.wide();
    let channels = tc.split(dst.ne[0]);
    for seq in 0..dst.ne[2] {
        for t in 0..dst.ne[1] {
            let out = dst.row(t, seq, 0).wrapping_add(channels.start * 4);
            // SAFETY: this thread's channels of one dense f32 result row (the support check):
            // no other thread writes them, and no source overlaps the result (the plan).
            let out = unsafe { f32_row_mut(out, channels.len()) };
            for (o, i) in out.iter_mut().zip(channels.clone()) {
                // SAFETY: elements `t..t + d_conv` of channel `i`'s dense window row lie in
                // `sx` (`t + d_conv <= sx.ne0`, the support check), and `c`'s row `i` holds
                // `d_conv` values; nothing writes the sources meanwhile.
                let (window, kernel) = unsafe {
                    (
                        f32_row(sx.row(i, seq, 0).wrapping_add(t * 4), d_conv),
                        f32_row(c.row(i, 0, 0), d_conv),
                    )
                };
                *o = leftovers_f32(0.0, window, kernel, wide);
            }
        }
    }
    Ok(())
}

/// GATED_DELTA_NET keeping `snapshots` states.
pub(crate) fn gated_delta_net(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    snapshots: usize,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if task.features.has_avx2() {
        // SAFETY: the node's features say the CPU has FMA (with AVX2).
        return unsafe { delta_net_fma(task, tc, snapshots) };
    }
    delta_net_units(task, tc, snapshots)
}

/// [`delta_net_units`] compiled with FMA (see [`ssm_conv_fma`]).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn delta_net_fma(task: &NodeTask, tc: &mut ThreadCtx<'_>, snapshots: usize) -> Result<()> {
    delta_net_units(task, tc, snapshots)
}

#[inline(always)]
fn delta_net_units(task: &NodeTask, tc: &mut ThreadCtx<'_>, snapshots: usize) -> Result<()> {
    let net = DeltaNet::new(task, snapshots)?;
    let s_v = net.s_v;
    let (delta, rest) = tc.scratch.split_at_mut(s_v.min(tc.scratch.len()));
    let delta = scratch_slice(delta, s_v)?;
    let mut work = match snapshots > 1 {
        true => Some(scratch_slice(rest, s_v * s_v)?),
        false => None,
    };
    for unit in task::claimed(tc.claim, net.h * net.n_seqs) {
        net.unit(unit % net.h, unit / net.h, delta, work.as_deref_mut());
    }
    Ok(())
}

/// One GATED_DELTA_NET node: its views and sizes.
struct DeltaNet<'a> {
    dst: &'a TensorView,
    q: &'a TensorView,
    k: &'a TensorView,
    v: &'a TensorView,
    g: &'a TensorView,
    beta: &'a TensorView,
    state: &'a TensorView,
    features: CpuFeatures,
    s_v: usize,
    h: usize,
    n_tokens: usize,
    n_seqs: usize,
    snapshots: usize,
    /// The new state goes over the state source ([`NodeTask::state_in_place`]).
    in_place: bool,
}

impl<'a> DeltaNet<'a> {
    fn new(task: &'a NodeTask, snapshots: usize) -> Result<Self> {
        let v = task.src(2)?;
        let [s_v, h, n_tokens, n_seqs] = v.ne;
        Ok(DeltaNet {
            dst: &task.dst,
            q: task.src(0)?,
            k: task.src(1)?,
            v,
            g: task.src(3)?,
            beta: task.src(4)?,
            state: task.src(5)?,
            features: task.features,
            s_v,
            h,
            n_tokens,
            n_seqs,
            snapshots,
            in_place: task.state_in_place && snapshots == 1,
        })
    }

    /// Row `(head, token, seq)` of `q` or `k`, whose heads and sequences broadcast as ggml's:
    /// head `head % H_k`, sequence `seq / (n_seqs / B_k)`.
    fn qk_row(&self, x: &TensorView, head: usize, token: usize, seq: usize) -> *mut u8 {
        let per_seq = self.n_seqs / x.ne[3].max(1);
        x.row(head % x.ne[1].max(1), token, seq / per_seq.max(1))
    }

    /// The result's state block of `(head, seq)` in snapshot `slot`.
    fn state_out(&self, slot: usize, head: usize, seq: usize) -> *mut u8 {
        let s2 = self.s_v * self.s_v;
        let outputs = self.s_v * self.h * self.n_tokens * self.n_seqs;
        let at = outputs + slot * s2 * self.h * self.n_seqs + (seq * self.h + head) * s2;
        self.dst.ptr.wrapping_add(at * 4)
    }

    /// The result's output row of `(head, token, seq)`.
    fn output(&self, head: usize, token: usize, seq: usize) -> *mut u8 {
        let row = seq * self.n_tokens + token;
        self.dst.row(row, 0, 0).wrapping_add(head * self.s_v * 4)
    }

    /// Every token of `(head, seq)`: the state starts from the source's, evolves in `work`
    /// (more than one snapshot) or in place in snapshot 0, and the snapshots past the last
    /// token are zeros.
    fn unit(&self, head: usize, seq: usize, delta: &mut [f32], work: Option<&mut [f32]>) {
        let s2 = self.s_v * self.s_v;
        let s = if self.in_place {
            // SAFETY: the contiguous state source holds `S_v²` values at (0, head, seq), this
            // unit's alone; the plan made this node its writer (no other source meets it, no
            // task runs on it meanwhile).
            unsafe { f32_row_mut(self.state.row(0, head, seq), s2) }
        } else {
            // SAFETY: the state block of (head, seq) in slot 0 of the contiguous result (the
            // support check sizes it) is this unit's alone; no source overlaps the result.
            let s =
                work.unwrap_or_else(|| unsafe { f32_row_mut(self.state_out(0, head, seq), s2) });
            // SAFETY: the contiguous state source holds `S_v²` values at (0, head, seq).
            s.copy_from_slice(unsafe { f32_row(self.state.row(0, head, seq), s2) });
            s
        };
        for token in 0..self.n_tokens {
            self.step(s, delta, head, token, seq);
            let slot = self.n_tokens - 1 - token;
            if self.snapshots > 1 && slot < self.snapshots {
                // SAFETY: as for slot 0: the unit's own block of snapshot `slot`.
                unsafe { f32_row_mut(self.state_out(slot, head, seq), s2) }.copy_from_slice(s);
            }
        }
        let written = if self.snapshots == 1 {
            1
        } else {
            self.n_tokens
        };
        for slot in written..self.snapshots {
            // SAFETY: as above.
            unsafe { f32_row_mut(self.state_out(slot, head, seq), s2) }.fill(0.0);
        }
    }

    /// One token of `(head, seq)` on state `s` (`S_v` rows of `S_v`, row `j` is column `j` of
    /// ggml's `S`).
    fn step(&self, s: &mut [f32], delta: &mut [f32], head: usize, token: usize, seq: usize) {
        let (n, f) = (self.s_v, self.features);
        // SAFETY: dense f32 rows of in-bounds indices (the support check: q and k broadcast
        // onto v's heads and sequences, g holds 1 or S_v values per row, beta 1); nothing
        // writes the sources meanwhile.
        let (q, k, v, g, beta) = unsafe {
            (
                f32_row(self.qk_row(self.q, head, token, seq), n),
                f32_row(self.qk_row(self.k, head, token, seq), n),
                f32_row(self.v.row(head, token, seq), n),
                f32_row(self.g.row(head, token, seq), self.g.ne[0]),
                f32_row(self.beta.row(head, token, seq), 1)[0],
            )
        };
        if g.len() == n {
            for (d, &x) in delta.iter_mut().zip(g) {
                *d = x.exp();
            }
            for row in s.chunks_exact_mut(n) {
                for (x, &d) in row.iter_mut().zip(&*delta) {
                    *x *= d;
                }
            }
        } else {
            let decay = g[0].exp();
            s.iter_mut().for_each(|x| *x *= decay);
        }
        for (d, (row, &vj)) in delta.iter_mut().zip(s.chunks_exact(n).zip(v)) {
            *d = (vj - vec_dot(f, Flavor::F32, row, k)) * beta;
        }
        // The rank-one update, one FMA per element as ggml's CPU computes it.
        for (row, &d) in s.chunks_exact_mut(n).zip(&*delta) {
            fma_axpy(row, k, d, f.has_avx2());
        }
        let scale = 1.0 / (n as f32).sqrt();
        // SAFETY: the output row of (head, token, seq): `S_v` values of the contiguous result
        // that only this unit writes.
        let out = unsafe { f32_row_mut(self.output(head, token, seq), n) };
        for (o, row) in out.iter_mut().zip(s.chunks_exact(n)) {
            *o = vec_dot(f, Flavor::F32, row, q) * scale;
        }
    }
}
