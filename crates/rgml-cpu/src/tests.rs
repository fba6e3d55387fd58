//! Kernel tests against straightforward references, threading, aliasing and error paths.

use crate::{CpuBackend, CpuDevice};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::HostMemory;
use rgml::{
    Backend, BufferTypeRef, Context, DType, Device, Error, Graph, RopeMode, RopeParams, TensorId,
};
use std::sync::Arc;

fn buffer_type() -> BufferTypeRef {
    CpuDevice::new("CPU").buffer_type()
}

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f32 = r.gen_range(-1.0..1.0);
            if v.abs() < 0.01 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

fn encode(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(v).to_vec(),
        DType::F16 => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => panic!("encode {dtype}"),
    }
}

fn decode(dtype: DType, b: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => panic!("decode {dtype}"),
    }
}

/// Values as the dtype stores them (rounded through it).
fn rounded(dtype: DType, v: &[f32]) -> Vec<f32> {
    decode(dtype, &encode(dtype, v))
}

/// Fill a contiguous tensor with random values; returns them (rounded to the dtype).
fn fill(ctx: &Context, id: TensorId, seed: u64) -> Vec<f32> {
    let t = &ctx[id];
    let v = rounded(t.dtype, &rnd(t.nelements(), seed));
    ctx.tensor_set(id, 0, &encode(t.dtype, &v)).unwrap();
    v
}

fn read(ctx: &Context, id: TensorId) -> Vec<f32> {
    let t = &ctx[id];
    assert!(t.is_contiguous());
    decode(t.dtype, &ctx.tensor_bytes(id).unwrap())
}

fn compute(ctx: &mut Context, outs: &[TensorId], nth: usize) -> rgml::Result<()> {
    let g = Graph::build(ctx, outs)?;
    let mut be = CpuBackend::new(nth)?;
    be.graph_compute(ctx, &g)
}

#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g == w);
        assert!(ok, "element {i}: got {g}, want {w}");
    }
}

/// Logical element `(i0, i1, i2, i3)` of a contiguous `ne` tensor.
fn at(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

fn for_each(ne: [usize; 4], mut f: impl FnMut([usize; 4])) {
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    f([i0, i1, i2, i3]);
                }
            }
        }
    }
}

#[test]
fn binary_ops_broadcast() {
    for (dtype, tol) in [(DType::F32, 1e-6), (DType::F16, 2e-3), (DType::BF16, 1e-2)] {
        for (k, nth) in [(0usize, 1usize), (1, 3), (2, 2), (3, 4)] {
            let mut ctx = Context::new();
            let ne = [8, 3, 4, 2];
            let a = ctx.new_tensor(dtype, &ne).unwrap();
            let bne = [[8, 3, 4, 2], [4, 1, 2, 1], [1, 3, 1, 2], [8, 1, 4, 1]][k];
            let b = ctx.new_tensor(DType::F32, &bne).unwrap();
            let outs = [
                ctx.add(a, b).unwrap(),
                ctx.sub(a, b).unwrap(),
                ctx.mul(a, b).unwrap(),
                ctx.div(a, b).unwrap(),
            ];
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            let va = fill(&ctx, a, 1);
            let vb = fill(&ctx, b, 2);
            compute(&mut ctx, &outs, nth).unwrap();
            let ops: [fn(f32, f32) -> f32; 4] =
                [|x, y| x + y, |x, y| x - y, |x, y| x * y, |x, y| x / y];
            for (o, f) in outs.iter().zip(ops) {
                let mut want = vec![0f32; va.len()];
                for_each(ne, |i| {
                    let j = [i[0] % bne[0], i[1] % bne[1], i[2] % bne[2], i[3] % bne[3]];
                    want[at(ne, i)] = f(va[at(ne, i)], vb[at(bne, j)]);
                });
                assert_close(&read(&ctx, *o), &rounded(dtype, &want), tol);
            }
        }
    }
}

#[test]
fn unary_ops() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[37, 5, 3]).unwrap();
    let b = ctx.new_tensor(DType::F32, &[37, 5, 3]).unwrap();
    let s = ctx.scale_bias(a, 1.5, -0.25).unwrap();
    let si = ctx.silu(a).unwrap();
    let ge = ctx.gelu(a).unwrap();
    let sw = ctx.swiglu(a, b).unwrap();
    let gg = ctx.geglu(a, b).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let va: Vec<f32> = fill(&ctx, a, 3).iter().map(|x| x * 4.0).collect();
    ctx.tensor_set_f32(a, &va).unwrap();
    let vb = fill(&ctx, b, 4);
    compute(&mut ctx, &[s, si, ge, sw, gg], 2).unwrap();
    let silu = |x: f32| x / (1.0 + (-x).exp());
    let gelu = |x: f32| {
        let x = x as f64;
        (0.5 * x
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()))
            as f32
    };
    let m = |f: &dyn Fn(usize) -> f32| (0..va.len()).map(f).collect::<Vec<_>>();
    assert_close(&read(&ctx, s), &m(&|i| va[i] * 1.5 - 0.25), 1e-6);
    assert_close(&read(&ctx, si), &m(&|i| silu(va[i])), 1e-5);
    // GELU goes through ggml's f16 table: input and result rounded to f16.
    assert_close(&read(&ctx, ge), &m(&|i| gelu(va[i])), 2e-3);
    assert_close(&read(&ctx, sw), &m(&|i| silu(va[i]) * vb[i]), 1e-5);
    assert_close(&read(&ctx, gg), &m(&|i| gelu(va[i]) * vb[i]), 2e-3);
}

#[test]
fn norms() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[67, 4, 3]).unwrap();
    let r = ctx.rms_norm(a, 1e-5).unwrap();
    let n = ctx.norm(a, 1e-5).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let va = fill(&ctx, a, 5);
    compute(&mut ctx, &[r, n], 3).unwrap();
    let (mut wr, mut wn) = (vec![], vec![]);
    for row in va.chunks(67) {
        let ms = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / 67.0;
        wr.extend(row.iter().map(|&x| (x as f64 / (ms + 1e-5).sqrt()) as f32));
        let mean = row.iter().map(|&x| x as f64).sum::<f64>() / 67.0;
        let var = row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / 67.0;
        wn.extend(
            row.iter()
                .map(|&x| ((x as f64 - mean) / (var + 1e-5).sqrt()) as f32),
        );
    }
    assert_close(&read(&ctx, r), &wr, 1e-5);
    assert_close(&read(&ctx, n), &wn, 1e-5);
}

fn softmax_ref(
    x: &[f32],
    ne: [usize; 4],
    mask: Option<(&[f32], [usize; 4])>,
    scale: f32,
    max_bias: f32,
) -> Vec<f32> {
    let n_head = ne[2];
    let n_head_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let m0 = 2f64.powf(-(max_bias as f64) / n_head_log2 as f64);
    let m1 = 2f64.powf(-(max_bias as f64) / 2.0 / n_head_log2 as f64);
    let mut out = vec![0f32; x.len()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            let slope = if max_bias > 0.0 {
                if i2 < n_head_log2 {
                    m0.powi(i2 as i32 + 1)
                } else {
                    m1.powi(2 * (i2 - n_head_log2) as i32 + 1)
                }
            } else {
                1.0
            };
            for i1 in 0..ne[1] {
                let w: Vec<f64> = (0..ne[0])
                    .map(|i0| {
                        let mut v = x[at(ne, [i0, i1, i2, i3])] as f64 * scale as f64;
                        if let Some((m, mne)) = mask {
                            v += slope * m[at(mne, [i0, i1, i2 % mne[2], i3 % mne[3]])] as f64;
                        }
                        v
                    })
                    .collect();
                let max = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = w.iter().map(|v| (v - max).exp()).sum();
                for i0 in 0..ne[0] {
                    out[at(ne, [i0, i1, i2, i3])] = ((w[i0] - max).exp() / sum) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn soft_max_with_masks_and_alibi() {
    for (mdtype, max_bias) in [
        (None, 0.0),
        (Some(DType::F32), 0.0),
        (Some(DType::F16), 8.0),
    ] {
        let mut ctx = Context::new();
        let ne = [19, 5, 6, 2];
        let a = ctx.new_tensor(DType::F32, &ne).unwrap();
        let mne = [19, 7, 3, 1];
        let m = mdtype.map(|d| ctx.new_tensor(d, &mne).unwrap());
        let o = ctx.soft_max_ext(a, m, 0.7, max_bias).unwrap();
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        let va: Vec<f32> = fill(&ctx, a, 7).iter().map(|x| x * 5.0).collect();
        ctx.tensor_set_f32(a, &va).unwrap();
        let vm = m.map(|m| fill(&ctx, m, 8));
        compute(&mut ctx, &[o], 2).unwrap();
        let want = softmax_ref(&va, ne, vm.as_deref().map(|v| (v, mne)), 0.7, max_bias);
        assert_close(&read(&ctx, o), &want, 1e-5);
    }
}

#[test]
fn diag_mask() {
    let mut ctx = Context::new();
    let ne = [6, 4, 2, 1];
    let a = ctx.new_tensor(DType::F32, &ne).unwrap();
    let o = ctx.diag_mask_inf(a, 1).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let va = fill(&ctx, a, 9);
    compute(&mut ctx, &[o], 2).unwrap();
    let got = read(&ctx, o);
    for_each(ne, |i| {
        let g = got[at(ne, i)];
        if i[0] > 1 + i[1] {
            assert_eq!(g, f32::NEG_INFINITY);
        } else {
            assert_eq!(g, va[at(ne, i)]);
        }
    });
}

fn rope_ref(
    x: &[f32],
    ne: [usize; 4],
    pos: &[i32],
    p: &RopeParams,
    freq_factors: Option<&[f32]>,
) -> Vec<f32> {
    let n_dims = p.n_dims;
    let theta_scale = (p.freq_base as f64).powf(-2.0 / n_dims as f64);
    let corr = crate::kernels::rope_corr_dims_for_tests(p);
    let mut out = x.to_vec();
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for k in 0..n_dims / 2 {
                    let i0 = 2 * k;
                    let ff = freq_factors.map_or(1.0, |f| f[k] as f64);
                    let pi = pos[i2 + p.mode.position_of_pair(k) * ne[2]];
                    let theta_extrap = pi as f64 * theta_scale.powi(k as i32) / ff;
                    let theta_interp = p.freq_scale as f64 * theta_extrap;
                    let mut theta = theta_interp;
                    let mut mscale = p.attn_factor as f64;
                    if p.ext_factor != 0.0 {
                        let y = ((i0 / 2) as f64 - corr[0] as f64)
                            / (corr[1] as f64 - corr[0] as f64).max(0.001);
                        let mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor as f64;
                        theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
                        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln();
                    }
                    let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
                    let (a, b) = match p.mode {
                        RopeMode::Normal => (i0, i0 + 1),
                        RopeMode::Neox | RopeMode::Mrope { .. } | RopeMode::Imrope { .. } => {
                            (k, k + n_dims / 2)
                        }
                    };
                    let (xa, xb) = (
                        x[at(ne, [a, i1, i2, i3])] as f64,
                        x[at(ne, [b, i1, i2, i3])] as f64,
                    );
                    out[at(ne, [a, i1, i2, i3])] = (xa * c - xb * s) as f32;
                    out[at(ne, [b, i1, i2, i3])] = (xa * s + xb * c) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn rope_modes_yarn_and_frequency_factors() {
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for (yarn, factors) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut ctx = Context::new();
            let ne = [16, 3, 5, 1];
            let a = ctx.new_tensor(DType::F32, &ne).unwrap();
            let pos = ctx.new_tensor(DType::I32, &[5]).unwrap();
            // More factors than the 6 pairs: as in ggml, only the first n_dims / 2 are read.
            let ff = ctx.new_tensor(DType::F32, &[8]).unwrap();
            let mut p = RopeParams::new(mode, 12, 10000.0);
            if yarn {
                p.n_ctx_orig = 4096;
                p.freq_scale = 0.25;
                p.ext_factor = 1.0;
                p.attn_factor = 1.1;
            }
            let o = ctx.rope_ext(a, pos, factors.then_some(ff), p).unwrap();
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            let va = fill(&ctx, a, 10);
            let vp = [0, 3, 17, 100, 2047];
            ctx.tensor_set_i32(pos, &vp).unwrap();
            // Llama 3's factors range from 1 (high frequencies) to 8 (low ones).
            let vf = [1.0, 1.0, 1.5, 2.25, 4.0, 8.0, -1.0, 0.0];
            ctx.tensor_set_f32(ff, &vf).unwrap();
            compute(&mut ctx, &[o], 2).unwrap();
            let want = rope_ref(&va, ne, &vp, &p, factors.then_some(&vf[..]));
            // Large angles lose precision in f32 argument reduction: a loose tolerance.
            assert_close(&read(&ctx, o), &want, 2e-4);
            if factors {
                // The factors change the low-frequency pairs.
                assert_ne!(want, rope_ref(&va, ne, &vp, &p, None));
            }
        }
    }
}

fn matmul_ref(a: &[f32], ane: [usize; 4], b: &[f32], bne: [usize; 4]) -> Vec<f32> {
    let one = [ane[1], bne[1], bne[2], bne[3]];
    let mut out = vec![0f32; one.iter().product()];
    let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
    for_each(one, |i| {
        let mut s = 0f64;
        for k in 0..ane[0] {
            s += a[at(ane, [k, i[0], i[2] / r2, i[3] / r3])] as f64
                * b[at(bne, [k, i[1], i[2], i[3]])] as f64;
        }
        out[at(one, i)] = s as f32;
    });
    out
}

#[test]
fn mul_mat_plain_types_broadcast_and_strided_src1() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for strided in [false, true] {
            for nth in [1, 3] {
                let mut ctx = Context::new();
                let ane = [40, 9, 2, 1];
                let bne = [40, 5, 4, 2];
                let a = ctx.new_tensor(dtype, &ane).unwrap();
                let (b, bsrc) = if strided {
                    // src1 as the transpose of a [5, 40, 4, 2] tensor: dim 0 is strided.
                    let t = ctx.new_tensor(DType::F32, &[5, 40, 4, 2]).unwrap();
                    (ctx.transpose(t).unwrap(), t)
                } else {
                    let t = ctx.new_tensor(DType::F32, &bne).unwrap();
                    (t, t)
                };
                let o = ctx.mul_mat(a, b).unwrap();
                alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
                let va = fill(&ctx, a, 11);
                let vsrc = fill(&ctx, bsrc, 12);
                let vb = if strided {
                    let tne = [5, 40, 4, 2];
                    let mut vb = vec![0f32; vsrc.len()];
                    for_each(bne, |i| {
                        vb[at(bne, i)] = vsrc[at(tne, [i[1], i[0], i[2], i[3]])]
                    });
                    vb
                } else {
                    vsrc
                };
                // ggml multiplies F16/BF16 weights with src1 rounded to the weight type.
                let vb = rounded(dtype, &vb);
                compute(&mut ctx, &[o], nth).unwrap();
                assert_close(&read(&ctx, o), &matmul_ref(&va, ane, &vb, bne), 1e-5);
            }
        }
    }
}

#[test]
fn copies_between_layouts_and_types() {
    let mut ctx = Context::new();
    let ne = [6, 5, 4, 3];
    let a = ctx.new_tensor(DType::F32, &ne).unwrap();
    let p = ctx.permute(a, [2, 0, 1, 3]).unwrap(); // ne [5, 4, 6, 3]
    let pne = ctx[p].ne;
    let c = ctx.cont(p).unwrap();
    let c2 = ctx.cont_shape(p, &[20, 18]).unwrap();
    let h = ctx.new_tensor(DType::F16, &pne).unwrap();
    let cp = ctx.cpy(p, h).unwrap();
    let back = ctx.new_tensor(DType::F32, &[360]).unwrap();
    let cb = ctx.cpy(cp, back).unwrap();
    let bf = ctx.new_tensor(DType::BF16, &[6, 5, 4, 3]).unwrap();
    let tb = ctx.transpose(bf).unwrap(); // strided dst: ne [5, 6, 4, 3]
    let a_t = ctx.transpose(a).unwrap();
    let cbf = ctx.cpy(a_t, tb).unwrap();
    let i = ctx.new_tensor(DType::I32, &[7, 3]).unwrap();
    let it = ctx.transpose(i).unwrap();
    let ic = ctx.cont(it).unwrap();
    let d = ctx.dup(a).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let va = fill(&ctx, a, 13);
    let vi: Vec<i32> = (0..21).map(|x| x * 1_000_003 - 7).collect();
    ctx.tensor_set_i32(i, &vi).unwrap();
    compute(&mut ctx, &[c, c2, cb, cbf, ic, d], 3).unwrap();
    let mut want = vec![0f32; va.len()];
    for_each(pne, |j| {
        want[at(pne, j)] = va[at(ne, [j[2], j[0], j[1], j[3]])]
    });
    assert_eq!(read(&ctx, c), want);
    assert_eq!(read(&ctx, c2), want);
    assert_eq!(read(&ctx, cb), rounded(DType::F16, &want));
    assert_eq!(read(&ctx, d), va);
    // The transposed bf16 destination holds the source in its natural layout.
    assert_eq!(read(&ctx, bf), rounded(DType::BF16, &va));
    let got_i = ctx.tensor_get_i32(ic).unwrap();
    let mut want_i = vec![0i32; 21];
    for r in 0..7 {
        for c in 0..3 {
            want_i[c + 3 * r] = vi[r + 7 * c];
        }
    }
    assert_eq!(got_i, want_i);
}

#[test]
fn concat_all_dims() {
    for dim in 0..4 {
        let mut ctx = Context::new();
        let ane = [3, 4, 2, 2];
        let mut bne = ane;
        bne[dim] = 3;
        let a = ctx.new_tensor(DType::F32, &ane).unwrap();
        let b = ctx.new_tensor(DType::F32, &bne).unwrap();
        let o = ctx.concat(a, b, dim).unwrap();
        let ia = ctx.new_tensor(DType::I32, &ane).unwrap();
        let ib = ctx.new_tensor(DType::I32, &bne).unwrap();
        let io = ctx.concat(ia, ib, dim).unwrap();
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        let va = fill(&ctx, a, 14);
        let vb = fill(&ctx, b, 15);
        let ia_v: Vec<i32> = (0..48).collect();
        let ib_v: Vec<i32> = (100..100 + bne.iter().product::<usize>() as i32).collect();
        ctx.tensor_set_i32(ia, &ia_v).unwrap();
        ctx.tensor_set_i32(ib, &ib_v).unwrap();
        compute(&mut ctx, &[o, io], 2).unwrap();
        let one = ctx[o].ne;
        let got = read(&ctx, o);
        let goti = ctx.tensor_get_i32(io).unwrap();
        for_each(one, |i| {
            let (w, wi) = if i[dim] < ane[dim] {
                (va[at(ane, i)], ia_v[at(ane, i)])
            } else {
                let mut j = i;
                j[dim] -= ane[dim];
                (vb[at(bne, j)], ib_v[at(bne, j)])
            };
            assert_eq!(got[at(one, i)], w);
            assert_eq!(goti[at(one, i)], wi);
        });
    }
}

/// REPEAT tiles exactly (bytes, every type ggml-cpu repeats), over any thread count, from a
/// source whose outer dims are permuted; a source whose rows are not dense (a transposed one,
/// which ggml-cpu asserts against) is refused.
#[test]
fn repeat_tiles_every_dim_and_refuses_strided_rows() {
    for (dtype, nth) in [
        (DType::F32, 1),
        (DType::F16, 3),
        (DType::BF16, 4),
        (DType::F32, 7),
    ] {
        let mut ctx = Context::new();
        let ane = [5, 3, 2, 1];
        let a = ctx.new_tensor(dtype, &ane).unwrap();
        let ne = [10, 6, 4, 3];
        let r = ctx.repeat(a, &ne).unwrap();
        // Outer dims permuted: rows stay dense.
        let b = ctx.new_tensor(dtype, &[5, 2, 3]).unwrap();
        let bp = ctx.permute(b, [0, 2, 1, 3]).unwrap();
        let rp = ctx.repeat(bp, &ne).unwrap();
        // llama.cpp's per-expert scales, one per row.
        let s = ctx.new_tensor(dtype, &[1, 8]).unwrap();
        let rs = ctx.repeat(s, &[1, 8, 5]).unwrap();
        let ia = ctx.new_tensor(DType::I32, &ane).unwrap();
        let ir = ctx.repeat(ia, &ne).unwrap();
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        let va = fill(&ctx, a, 21);
        let vb = fill(&ctx, b, 22);
        let vs = fill(&ctx, s, 23);
        let ia_v: Vec<i32> = (0..30).map(|v| v * 7 - 100).collect();
        ctx.tensor_set_i32(ia, &ia_v).unwrap();
        compute(&mut ctx, &[r, rp, rs, ir], nth).unwrap();
        let (got, gotp, gots) = (read(&ctx, r), read(&ctx, rp), read(&ctx, rs));
        let goti = ctx.tensor_get_i32(ir).unwrap();
        for_each(ne, |i| {
            let j = [i[0] % 5, i[1] % 3, i[2] % 2, 0];
            assert_eq!(got[at(ne, i)], va[at(ane, j)], "{dtype} {i:?}");
            assert_eq!(goti[at(ne, i)], ia_v[at(ane, j)], "{i:?}");
            // bp's element (j0, j1, j2) is b's (j0, j2, j1).
            let k = [j[0], j[2], j[1], 0];
            assert_eq!(gotp[at(ne, i)], vb[at([5, 2, 3, 1], k)], "{dtype} {i:?}");
        });
        let want_s: Vec<f32> = (0..40).map(|k| vs[k % 8]).collect();
        assert_eq!(gots, want_s);
    }
    // A transposed source: dim 0 strided.
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[3, 4]).unwrap();
    let t = ctx.transpose(a).unwrap();
    let r = ctx.repeat(t, &[8, 6]).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let err = crate::check_supported(&ctx, r).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("REPEAT"), "{err}");
    assert!(compute(&mut ctx, &[r], 2).is_err());
}

#[test]
fn get_rows_set_rows_argmax() {
    let mut ctx = Context::new();
    let w32 = ctx.new_tensor(DType::F32, &[8, 10, 2]).unwrap();
    let w16 = ctx.new_tensor(DType::F16, &[8, 10, 2]).unwrap();
    let wi = ctx.new_tensor(DType::I32, &[8, 10, 2]).unwrap();
    let idx = ctx.new_tensor(DType::I32, &[3, 2]).unwrap();
    let g32 = ctx.get_rows(w32, idx).unwrap();
    let g16 = ctx.get_rows(w16, idx).unwrap();
    let gi = ctx.get_rows(wi, idx).unwrap();
    let cache = ctx.new_tensor(DType::F16, &[8, 6, 2]).unwrap();
    let rows = ctx.new_tensor(DType::F32, &[8, 3, 2]).unwrap();
    let sidx = ctx.new_tensor(DType::I32, &[3, 1]).unwrap();
    let sr = ctx.set_rows(cache, rows, sidx).unwrap();
    let m = ctx.new_tensor(DType::F32, &[9, 4]).unwrap();
    let am = ctx.argmax(m).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let v32 = fill(&ctx, w32, 16);
    let v16 = fill(&ctx, w16, 17);
    let vi: Vec<i32> = (0..160).collect();
    ctx.tensor_set_i32(wi, &vi).unwrap();
    let vidx = [9, 0, 4, 1, 1, 7];
    ctx.tensor_set_i32(idx, &vidx).unwrap();
    ctx.tensor_memset(cache, 0, 0, ctx[cache].nbytes()).unwrap();
    let vrows = fill(&ctx, rows, 18);
    ctx.tensor_set_i32(sidx, &[5, 0, 2]).unwrap();
    let mut vm = fill(&ctx, m, 19);
    vm[9 + 4] = 3.0;
    vm[9 + 6] = 3.0; // tie: the first wins
    ctx.tensor_set_f32(m, &vm).unwrap();
    compute(&mut ctx, &[g32, g16, gi, sr, am], 2).unwrap();
    let (mut w32, mut w16, mut wiv) = (vec![], vec![], vec![]);
    for i2 in 0..2 {
        for i1 in 0..3 {
            let r = vidx[i1 + 3 * i2] as usize;
            let off = (r + 10 * i2) * 8;
            w32.extend_from_slice(&v32[off..off + 8]);
            w16.extend_from_slice(&v16[off..off + 8]);
            wiv.extend_from_slice(&vi[off..off + 8]);
        }
    }
    assert_eq!(read(&ctx, g32), w32);
    assert_eq!(read(&ctx, g16), w16);
    assert_eq!(ctx.tensor_get_i32(gi).unwrap(), wiv);
    let got = read(&ctx, cache);
    let mut want = vec![0f32; 96];
    for i2 in 0..2 {
        for (i1, r) in [5usize, 0, 2].into_iter().enumerate() {
            for k in 0..8 {
                want[k + 8 * (r + 6 * i2)] = vrows[k + 8 * (i1 + 3 * i2)];
            }
        }
    }
    assert_eq!(got, rounded(DType::F16, &want));
    let got_am = ctx.tensor_get_i32(am).unwrap();
    for (r, &g) in got_am.iter().enumerate() {
        let row = &vm[r * 9..r * 9 + 9];
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(g as usize, row.iter().position(|&x| x == max).unwrap());
    }
    assert_eq!(got_am[1], 4);
}

#[test]
fn get_rows_bad_index_is_an_error() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::F32, &[4, 3]).unwrap();
    let idx = ctx.new_tensor(DType::I32, &[2]).unwrap();
    let g = ctx.get_rows(w, idx).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    fill(&ctx, w, 1);
    ctx.tensor_set_i32(idx, &[1, 3]).unwrap();
    let err = compute(&mut ctx, &[g], 2).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { .. }), "{err}");
    ctx.tensor_set_i32(idx, &[-1, 0]).unwrap();
    assert!(compute(&mut ctx, &[g], 1).is_err());
}

/// A small transformer-like block, for thread-count and aliasing comparisons.
fn block(ctx: &mut Context) -> (Vec<TensorId>, TensorId) {
    let x = ctx.new_tensor(DType::F32, &[32, 6]).unwrap();
    let wq = ctx.new_tensor(DType::F16, &[32, 32]).unwrap();
    let norm_w = ctx.new_tensor(DType::F32, &[32]).unwrap();
    let pos = ctx.new_tensor(DType::I32, &[6]).unwrap();
    let n = ctx.rms_norm(x, 1e-6).unwrap();
    let n = ctx.mul(n, norm_w).unwrap();
    let q = ctx.mul_mat(wq, n).unwrap();
    let q = ctx.reshape(q, &[8, 4, 6]).unwrap();
    let q = ctx
        .rope(q, pos, RopeParams::new(RopeMode::Neox, 8, 10000.0))
        .unwrap();
    let qp = ctx.permute(q, [0, 2, 1, 3]).unwrap(); // [8, 6, 4]
    let kq = ctx.mul_mat(qp, qp).unwrap(); // [6, 6, 4]
    let kq = ctx.diag_mask_inf(kq, 0).unwrap();
    let kq = ctx.soft_max_ext(kq, None, 0.35, 0.0).unwrap();
    let v = ctx.cont(qp).unwrap();
    let vt = ctx.transpose(v).unwrap();
    let vt = ctx.cont(vt).unwrap(); // [6, 8, 4]
    let o = ctx.mul_mat(vt, kq).unwrap(); // [8, 6, 4]
    let o = ctx.permute(o, [0, 2, 1, 3]).unwrap();
    let o = ctx.cont_shape(o, &[32, 6]).unwrap();
    let g = ctx.gelu(o).unwrap();
    let out = ctx.add(g, x).unwrap();
    ctx.argmax(out).unwrap();
    (vec![x, wq, norm_w, pos], ctx.concat(out, o, 1).unwrap())
}

fn run_block(nth: usize) -> (Vec<f32>, Vec<i32>) {
    let mut ctx = Context::new();
    let (inputs, out) = block(&mut ctx);
    let am = ctx.find_argmax();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    for (k, &i) in inputs.iter().enumerate() {
        if ctx[i].dtype == DType::I32 {
            ctx.tensor_set_i32(i, &[0, 1, 2, 5, 9, 30]).unwrap();
        } else {
            fill(&ctx, i, 100 + k as u64);
        }
    }
    compute(&mut ctx, &[out, am], nth).unwrap();
    (read(&ctx, out), ctx.tensor_get_i32(am).unwrap())
}

trait FindArgmax {
    fn find_argmax(&self) -> TensorId;
}

impl FindArgmax for Context {
    fn find_argmax(&self) -> TensorId {
        self.ids()
            .find(|&i| self[i].op == rgml::Op::Argmax)
            .unwrap()
    }
}

#[test]
fn thread_counts_give_identical_results() {
    let (one, am1) = run_block(1);
    assert!(one.iter().all(|v| v.is_finite()));
    for nth in [2, 3, 5] {
        let (many, am) = run_block(nth);
        assert_eq!(one, many, "{nth} threads");
        assert_eq!(am1, am);
    }
}

/// Make node `id` share its first source's memory, as the graph allocator does for in-place ops.
fn alias_to_src0(ctx: &mut Context, id: TensorId) {
    let src = ctx[id].src[0];
    let data = ctx[src].data.clone();
    ctx.get_mut(id).unwrap().data = data;
}

#[test]
fn in_place_ops_match_out_of_place() {
    type Build = fn(&mut Context, TensorId, TensorId, TensorId) -> TensorId;
    let builds: Vec<(&str, Build)> = vec![
        ("add", |c, a, b, _| c.add(a, b).unwrap()),
        ("mul_self", |c, a, _, _| c.mul(a, a).unwrap()),
        ("div_bcast", |c, a, _, r| c.div(a, r).unwrap()),
        ("scale", |c, a, _, _| c.scale_bias(a, 2.0, 1.0).unwrap()),
        ("silu", |c, a, _, _| c.silu(a).unwrap()),
        ("gelu", |c, a, _, _| c.gelu(a).unwrap()),
        ("swiglu", |c, a, b, _| c.swiglu(a, b).unwrap()),
        ("rms_norm", |c, a, _, _| c.rms_norm(a, 1e-5).unwrap()),
        ("norm", |c, a, _, _| c.norm(a, 1e-5).unwrap()),
        ("soft_max", |c, a, _, _| {
            c.soft_max_ext(a, None, 0.5, 0.0).unwrap()
        }),
        ("diag_mask", |c, a, _, _| c.diag_mask_inf(a, 2).unwrap()),
    ];
    for (name, build) in builds {
        let mut results = vec![];
        for in_place in [false, true] {
            let mut ctx = Context::new();
            let a = ctx.new_tensor(DType::F32, &[24, 8, 3]).unwrap();
            let b = ctx.new_tensor(DType::F32, &[24, 8, 3]).unwrap();
            let r = ctx.new_tensor(DType::F32, &[24, 1, 3]).unwrap();
            let o = build(&mut ctx, a, b, r);
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            fill(&ctx, a, 20);
            fill(&ctx, b, 21);
            fill(&ctx, r, 22);
            if in_place {
                alias_to_src0(&mut ctx, o);
            }
            compute(&mut ctx, &[o], 3).unwrap();
            results.push(read(&ctx, o));
        }
        assert_eq!(results[0], results[1], "{name}");
    }
    // ROPE in place, with and without frequency factors.
    for factors in [false, true] {
        let mut results = vec![];
        for in_place in [false, true] {
            let mut ctx = Context::new();
            let a = ctx.new_tensor(DType::F32, &[16, 4, 5]).unwrap();
            let pos = ctx.new_tensor(DType::I32, &[5]).unwrap();
            let ff = ctx.new_tensor(DType::F32, &[8]).unwrap();
            let p = RopeParams::new(RopeMode::Normal, 16, 10000.0);
            let o = ctx.rope_ext(a, pos, factors.then_some(ff), p).unwrap();
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            fill(&ctx, a, 23);
            ctx.tensor_set_i32(pos, &[1, 2, 3, 4, 5]).unwrap();
            ctx.tensor_set_f32(ff, &[1.0, 1.0, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0])
                .unwrap();
            if in_place {
                alias_to_src0(&mut ctx, o);
            }
            compute(&mut ctx, &[o], 2).unwrap();
            results.push(read(&ctx, o));
        }
        assert_eq!(results[0], results[1], "rope, factors: {factors}");
    }
}

#[test]
fn rope_frequency_factors_aliasing_the_destination_are_refused() {
    // Every row reads every factor: factors in the destination's memory would be overwritten
    // while other rows still read them.
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[4, 1, 1]).unwrap();
    let pos = ctx.new_tensor(DType::I32, &[1]).unwrap();
    let ff = ctx.new_tensor(DType::F32, &[4]).unwrap();
    let o = ctx
        .rope_ext(
            a,
            pos,
            Some(ff),
            RopeParams::new(RopeMode::Neox, 4, 10000.0),
        )
        .unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let data = ctx[ff].data.clone();
    ctx.get_mut(o).unwrap().data = data;
    let err = compute(&mut ctx, &[o], 2).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn partial_overlap_is_refused() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[16, 4]).unwrap();
    let o = ctx.cont(a).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    // CONT is not an in-place op: aliasing it is refused instead of racing.
    alias_to_src0(&mut ctx, o);
    let err = compute(&mut ctx, &[o], 2).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn read_only_buffers_refuse_writes() {
    let dev = CpuDevice::new("CPU");
    let mem: Arc<dyn HostMemory> = Arc::new(vec![0u8; 256]);
    let buf = dev.buffer_from_host_memory(mem, 256).unwrap();
    assert!(buf.is_read_only() && buf.is_host());
    assert!(matches!(buf.set(0, &[1]), Err(Error::ReadOnlyBuffer(_))));
    assert!(buf.clear(0).is_err());
    // Reading weights from it works; writing a node into it does not.
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::F32, &[8, 2]).unwrap();
    ctx.set_data(w, buf.clone(), 0).unwrap();
    let s = ctx.scale(w, 2.0).unwrap();
    alloc_ctx_tensors(&mut ctx, &dev.buffer_type()).unwrap();
    compute(&mut ctx, &[s], 1).unwrap();
    assert_eq!(read(&ctx, s), vec![0.0; 16]);
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[8, 2]).unwrap();
    let s = ctx.scale(a, 2.0).unwrap();
    ctx.set_data(s, buf, 0).unwrap();
    alloc_ctx_tensors(&mut ctx, &dev.buffer_type()).unwrap();
    let err = compute(&mut ctx, &[s], 1).unwrap_err();
    assert!(matches!(err, Error::ReadOnlyBuffer(_)), "{err}");
}

#[test]
fn abort_callback_stops_compute() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for nth in [1, 2] {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[8]).unwrap();
        let mut x = a;
        for _ in 0..10 {
            x = ctx.scale_bias(x, 1.0, 1.0).unwrap();
        }
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        ctx.tensor_set_f32(a, &[0.0; 8]).unwrap();
        let g = Graph::build(&mut ctx, &[x]).unwrap();
        let mut be = CpuBackend::new(nth).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        be.set_abort_callback(Box::new(move || c.fetch_add(1, Ordering::SeqCst) >= 2));
        let err = be.graph_compute(&ctx, &g).unwrap_err();
        assert!(matches!(err, Error::Aborted), "{err}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "stops right after the third node"
        );
        be.clear_abort_callback();
        be.graph_compute(&ctx, &g).unwrap();
        assert_eq!(read(&ctx, x), vec![10.0; 8]);
    }
}

#[test]
fn unsupported_ops_are_errors() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::Q8_K, &[256, 2]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[256, 1]).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    let dev = CpuDevice::new("CPU");
    assert!(!dev.supports_op(&ctx, y));
    assert!(dev.supports_op(&ctx, x), "leafs need no kernel");
    let err = compute(&mut ctx, &[y], 2).unwrap_err();
    match err {
        Error::Unsupported { what, .. } => {
            assert!(what.contains("MUL_MAT") && what.contains("q8_K"), "{what}")
        }
        e => panic!("{e}"),
    }
}

#[test]
fn registry_and_params() {
    crate::register();
    let dev = rgml::registry::device("CPU").unwrap();
    assert_eq!(dev.device_type(), rgml::backend::DeviceType::Cpu);
    assert!(!dev.description().is_empty());
    assert!(dev.memory().total >= dev.memory().free);
    let mut be = rgml::registry::init_backend("CPU:n_threads=3").unwrap();
    let cpu = be.downcast_mut::<CpuBackend>().unwrap();
    assert_eq!(cpu.n_threads(), 3);
    assert!(rgml::registry::init_backend("CPU:n_threads=x").is_err());
    assert!(rgml::registry::init_backend("CPU:bogus=1").is_err());
    let bt = dev.buffer_type();
    assert!(bt.is_host());
    assert!(dev.supports_buffer_type(&bt));
    assert_eq!(bt.device().unwrap().name(), "CPU");
    let buf = rgml::Buffer::alloc(&bt, 0).unwrap();
    assert_eq!(buf.size(), 0);
    let buf = rgml::Buffer::alloc(&bt, 100).unwrap();
    assert_eq!(buf.imp().base().unwrap().as_ptr() as usize % 64, 0);
    buf.memset(10, 7, 5).unwrap();
    let mut out = [0u8; 6];
    buf.get(9, &mut out).unwrap();
    assert_eq!(out, [0, 7, 7, 7, 7, 7]);
    let other = rgml::Buffer::alloc(&bt, 100).unwrap();
    other.copy_from(0, &buf, 10, 5).unwrap();
    other.get(0, &mut out).unwrap();
    assert_eq!(out, [7, 7, 7, 7, 7, 0]);
    assert!(buf.set(98, &[1, 2, 3]).is_err());

    // Several devices, each with its own buffer type.
    let reg = crate::CpuRegistry::with_devices(["CPU0", "CPU1"]);
    let devs = rgml::registry::Registry::devices(&reg);
    assert_eq!(devs.len(), 2);
    let (b0, b1) = (devs[0].buffer_type(), devs[1].buffer_type());
    assert_eq!((b0.name(), b1.name()), ("CPU0", "CPU1"));
    assert!(!rgml::backend::same_instance(&b0, &b1));
    // CPUn devices stand in for separate devices: each reads only its own memory; "CPU" any.
    assert!(devs[0].supports_buffer_type(&b0) && !devs[0].supports_buffer_type(&b1));
    assert!(dev.supports_buffer_type(&b0) && dev.supports_buffer_type(&b1));
    let be = devs[1]
        .init_backend(&rgml::backend::BackendParams::default())
        .unwrap();
    assert_eq!(be.name(), "CPU1");
}

const QUANT_WEIGHTS: [DType; 13] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::IQ4_NL,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ4_XS,
    DType::MXFP4,
];

fn quantize(dtype: DType, v: &[f32], ne0: usize) -> Vec<u8> {
    let rb = dtype.row_bytes(ne0).unwrap();
    let mut out = vec![0u8; rb * v.len() / ne0];
    for (src, dst) in v.chunks(ne0).zip(out.chunks_mut(rb)) {
        rgml::quant::quantize_row(dtype, src, dst).unwrap();
    }
    out
}

fn dequantize(dtype: DType, b: &[u8], ne0: usize) -> Vec<f32> {
    let rb = dtype.row_bytes(ne0).unwrap();
    let mut out = vec![0f32; b.len() / rb * ne0];
    for (src, dst) in b.chunks(rb).zip(out.chunks_mut(ne0)) {
        rgml::quant::dequantize_row(dtype, src, dst).unwrap();
    }
    out
}

#[test]
fn mul_mat_quantized_weights() {
    for dtype in QUANT_WEIGHTS {
        let mut outs = vec![];
        for nth in [1, 3] {
            let mut ctx = Context::new();
            let ane = [512, 7, 2, 1];
            let bne = [512, 3, 4, 1];
            let a = ctx.new_tensor(dtype, &ane).unwrap();
            let b = ctx.new_tensor(DType::F32, &bne).unwrap();
            let o = ctx.mul_mat(a, b).unwrap();
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            let wa = quantize(dtype, &rnd(512 * 14, 30), 512);
            ctx.tensor_set(a, 0, &wa).unwrap();
            let vb = fill(&ctx, b, 31);
            compute(&mut ctx, &[o], nth).unwrap();
            let got = read(&ctx, o);
            // Reference: dequantized weights against src1 rounded through the vec-dot type.
            let va = dequantize(dtype, &wa, 512);
            let vd = dtype.vec_dot_type();
            let vq = dequantize(vd, &quantize(vd, &vb, 512), 512);
            let want = matmul_ref(&va, ane, &vq, bne);
            let mags = matmul_ref(
                &va.iter().map(|x| x.abs()).collect::<Vec<_>>(),
                ane,
                &vq.iter().map(|x| x.abs()).collect::<Vec<_>>(),
                bne,
            );
            for ((g, w), m) in got.iter().zip(&want).zip(&mags) {
                assert!(
                    (g - w).abs() <= 1e-4 * m + 1e-5,
                    "{dtype}: got {g}, want {w}"
                );
            }
            // And close to the exact f32 product (catches a wrong vec-dot type).
            let exact = matmul_ref(&va, ane, &vb, bne);
            for ((g, w), m) in got.iter().zip(&exact).zip(&mags) {
                assert!(
                    (g - w).abs() <= 0.02 * m + 1e-3,
                    "{dtype}: got {g}, exact {w}"
                );
            }
            outs.push(got);
        }
        assert_eq!(outs[0], outs[1], "{dtype}: thread counts differ");
    }
}

#[test]
fn quantized_rows_copies_and_scatters() {
    for dtype in QUANT_WEIGHTS {
        let mut ctx = Context::new();
        let w = ctx.new_tensor(dtype, &[256, 5]).unwrap();
        let idx = ctx.new_tensor(DType::I32, &[3]).unwrap();
        let g = ctx.get_rows(w, idx).unwrap();
        let deq = ctx.new_tensor(DType::F32, &[256, 5]).unwrap();
        let d = ctx.cpy(w, deq).unwrap();
        let x = ctx.new_tensor(DType::F32, &[256, 4]).unwrap();
        let q = ctx.new_tensor(dtype, &[256, 4]).unwrap();
        let qc = ctx.cpy(x, q).unwrap();
        // f32 -> quantized from a transposed (strided) source.
        let xt_src = ctx.new_tensor(DType::F32, &[4, 256]).unwrap();
        let xt = ctx.transpose(xt_src).unwrap();
        let q2 = ctx.new_tensor(dtype, &[256, 4]).unwrap();
        let qt = ctx.cpy(xt, q2).unwrap();
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        let wb = quantize(dtype, &rnd(256 * 5, 40), 256);
        ctx.tensor_set(w, 0, &wb).unwrap();
        ctx.tensor_set_i32(idx, &[4, 0, 4]).unwrap();
        let vx = fill(&ctx, x, 41);
        let mut vt = vec![0f32; 1024];
        for r in 0..4 {
            for c in 0..256 {
                vt[r + 4 * c] = vx[c + 256 * r];
            }
        }
        ctx.tensor_set_f32(xt_src, &vt).unwrap();
        compute(&mut ctx, &[g, d, qc, qt], 2).unwrap();
        let wd = dequantize(dtype, &wb, 256);
        let want_g: Vec<f32> = [4usize, 0, 4]
            .iter()
            .flat_map(|&r| wd[r * 256..(r + 1) * 256].to_vec())
            .collect();
        assert_eq!(read(&ctx, g), want_g, "{dtype} get_rows");
        assert_eq!(read(&ctx, deq), wd, "{dtype} dequantizing cpy");
        let want_q = quantize(dtype, &vx, 256);
        assert_eq!(
            ctx.tensor_bytes(q).unwrap(),
            want_q,
            "{dtype} quantizing cpy"
        );
        assert_eq!(
            ctx.tensor_bytes(q2).unwrap(),
            want_q,
            "{dtype} strided quantizing cpy"
        );
    }
    for dtype in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ] {
        let mut ctx = Context::new();
        let cache = ctx.new_tensor(dtype, &[64, 6]).unwrap();
        let rows = ctx.new_tensor(DType::F32, &[64, 2]).unwrap();
        let sidx = ctx.new_tensor(DType::I32, &[2]).unwrap();
        let sr = ctx.set_rows(cache, rows, sidx).unwrap();
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        ctx.tensor_memset(cache, 0, 0, ctx[cache].nbytes()).unwrap();
        let vr = fill(&ctx, rows, 42);
        ctx.tensor_set_i32(sidx, &[3, 1]).unwrap();
        compute(&mut ctx, &[sr], 2).unwrap();
        let rb = dtype.row_bytes(64).unwrap();
        let got = ctx.tensor_bytes(cache).unwrap();
        let want = quantize(dtype, &vr, 64);
        assert_eq!(&got[3 * rb..4 * rb], &want[..rb], "{dtype}");
        assert_eq!(&got[rb..2 * rb], &want[rb..], "{dtype}");
        assert!(got[..rb].iter().all(|&b| b == 0));
    }
}

/// Rough matmul timings (run with `--ignored --nocapture`); asserts nothing about speed.
#[test]
#[ignore]
fn bench_mul_mat() {
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        for n in [1usize, 32] {
            let mut ctx = Context::new();
            let a = ctx.new_tensor(dtype, &[4096, 4096]).unwrap();
            let b = ctx.new_tensor(DType::F32, &[4096, n]).unwrap();
            let o = ctx.mul_mat(a, b).unwrap();
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            let row = rnd(4096, 1);
            let rb = dtype.row_bytes(4096).unwrap();
            let mut qrow = vec![0u8; rb];
            crate::kernels::row_from_f32_for_tests(dtype, &row, &mut qrow).unwrap();
            ctx.tensor_set(a, 0, &qrow.repeat(4096)).unwrap();
            fill(&ctx, b, 2);
            let g = Graph::build(&mut ctx, &[o]).unwrap();
            let mut be = CpuBackend::new(crate::default_n_threads()).unwrap();
            be.graph_compute(&ctx, &g).unwrap();
            let reps = if n == 1 { 20 } else { 3 };
            let t = std::time::Instant::now();
            for _ in 0..reps {
                be.graph_compute(&ctx, &g).unwrap();
            }
            let dt = t.elapsed().as_secs_f64() / reps as f64;
            let gflops = 2.0 * 4096.0 * 4096.0 * n as f64 / dt / 1e9;
            println!("{dtype} x {n}: {:.3} ms, {gflops:.1} GFLOP/s", dt * 1e3);
        }
    }
}

#[test]
fn non_host_buffers_are_refused() {
    // Memory the CPU cannot address (like a GPU's).
    let bt: BufferTypeRef = rgml::testing::VecBufferType::new("DeviceOnly")
        .with_alignment(64)
        .device_only()
        .shared();
    let dev = CpuDevice::new("CPU");
    assert!(!dev.supports_buffer_type(&bt));
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[8]).unwrap();
    let s = ctx.scale(a, 2.0).unwrap();
    alloc_ctx_tensors(&mut ctx, &bt).unwrap();
    let err = compute(&mut ctx, &[s], 2).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

/// Per-node overhead of the thread pool and barrier (run with `--ignored --nocapture`).
#[test]
#[ignore]
fn bench_small_nodes() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[4096]).unwrap();
    let mut x = a;
    for _ in 0..1000 {
        x = ctx.scale_bias(x, 1.0, 0.001).unwrap();
    }
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    fill(&ctx, a, 1);
    let g = Graph::build(&mut ctx, &[x]).unwrap();
    for nth in [1, 2, 4] {
        let mut be = CpuBackend::new(nth).unwrap();
        be.graph_compute(&ctx, &g).unwrap();
        let t = std::time::Instant::now();
        for _ in 0..10 {
            be.graph_compute(&ctx, &g).unwrap();
        }
        let per_node = t.elapsed().as_secs_f64() / 10.0 / 1000.0;
        println!("{nth} threads: {:.2} us per node", per_node * 1e6);
    }
}

/// The repacking buffer type, whether or not this CPU gets it by default (the packed kernels
/// have a portable path too).
fn repack_buffer_type() -> BufferTypeRef {
    let no_device: std::sync::Weak<dyn Device> = std::sync::Weak::<CpuDevice>::new();
    Arc::new(crate::CpuRepackBufferType::new("CPU_REPACK", no_device))
}

/// A weight of `dtype` and shape `ne` in repacked memory, holding `bytes`.
fn packed_weight(ctx: &mut Context, dtype: DType, ne: &[usize], bytes: &[u8]) -> TensorId {
    let buft = repack_buffer_type();
    let id = ctx.new_tensor(dtype, ne).unwrap();
    let buffer = rgml::Buffer::alloc(&buft, ctx[id].nbytes()).unwrap();
    rgml::alloc::TensorAllocator::new(buffer)
        .alloc(ctx, id)
        .unwrap();
    ctx.tensor_set(id, 0, bytes).unwrap();
    id
}

#[test]
fn repacked_weights_give_the_plain_weights_results_bit_for_bit() {
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
        let ane = [256, 12, 1, 1];
        let wa = quantize(dtype, &rnd(256 * 12, 40), 256);
        for nth in [1, 3] {
            let mut ctx = Context::new();
            let packed = packed_weight(&mut ctx, dtype, &ane[..2], &wa);
            // Reading it back gives the file layout, whole or by groups of rows.
            assert_eq!(ctx.tensor_bytes(packed).unwrap(), wa, "{dtype}");
            let row = dtype.row_bytes(256).unwrap();
            let mut part = vec![0u8; 2 * row];
            ctx.tensor_get(packed, 5 * row, &mut part).unwrap();
            assert_eq!(part, wa[5 * row..7 * row], "{dtype}: rows 5..7");
            let plain = ctx.new_tensor(dtype, &ane[..2]).unwrap();
            let mut outs = vec![];
            for n in [1, 5, 20] {
                let b = ctx.new_tensor(DType::F32, &[256, n, 2]).unwrap();
                outs.push((b, ctx.mul_mat(plain, b).unwrap()));
                outs.push((b, ctx.mul_mat(packed, b).unwrap()));
            }
            let idx = ctx.new_tensor(DType::I32, &[5]).unwrap();
            let rows_plain = ctx.get_rows(plain, idx).unwrap();
            let rows_packed = ctx.get_rows(packed, idx).unwrap();
            alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
            ctx.tensor_set(plain, 0, &wa).unwrap();
            let picks: Vec<u8> = [11i32, 0, 6, 3, 9]
                .iter()
                .flat_map(|i| i.to_le_bytes())
                .collect();
            ctx.tensor_set(idx, 0, &picks).unwrap();
            for (k, &(b, _)) in outs.iter().enumerate().step_by(2) {
                fill(&ctx, b, 41 + k as u64);
            }
            let mut roots: Vec<TensorId> = outs.iter().map(|o| o.1).collect();
            roots.extend([rows_plain, rows_packed]);
            compute(&mut ctx, &roots, nth).unwrap();
            for pair in outs.chunks(2) {
                let (want, got) = (read(&ctx, pair[0].1), read(&ctx, pair[1].1));
                assert!(want.iter().any(|v| *v != 0.0));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{dtype} nth {nth} {:?}",
                    ctx[pair[0].0].ne
                );
            }
            assert_eq!(read(&ctx, rows_packed), read(&ctx, rows_plain), "{dtype}");
        }
    }
}

#[test]
fn repacked_memory_refuses_what_it_cannot_hold() {
    let dtype = DType::Q4_1;
    let wa = quantize(dtype, &rnd(64 * 8, 42), 64);
    let mut ctx = Context::new();
    let packed = packed_weight(&mut ctx, dtype, &[64, 8], &wa);
    let row = dtype.row_bytes(64).unwrap();
    // Writes cover whole groups of 4 rows.
    assert!(ctx.tensor_set(packed, row, &wa[..row]).is_err());
    ctx.tensor_set(packed, 4 * row, &wa[4 * row..]).unwrap();
    assert_eq!(ctx.tensor_bytes(packed).unwrap(), wa);
    // Only whole, dense packable matrices are placed there.
    let buft = repack_buffer_type();
    for (dt, ne) in [
        (DType::Q4_1, vec![64, 6]),
        (DType::F32, vec![64, 8]),
        (DType::Q4_K, vec![256, 8]),
    ] {
        let id = ctx.new_tensor(dt, &ne).unwrap();
        let buffer = rgml::Buffer::alloc(&buft, ctx[id].nbytes()).unwrap();
        let r = rgml::alloc::TensorAllocator::new(buffer).alloc(&mut ctx, id);
        assert!(r.is_err(), "{dt} {ne:?} accepted");
        assert!(!buft.accepts_weight(&ctx[id], &[rgml::OpKind::MulMat]));
    }
    // Ops other than matrix products and row lookups cannot read the packed rows (the same
    // copy of plain memory is supported).
    let copy = ctx.cont(packed).unwrap();
    assert!(crate::check_supported(&ctx, copy).is_err());
    let plain = ctx.new_tensor(dtype, &[64, 8]).unwrap();
    let plain_copy = ctx.cont(plain).unwrap();
    alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
    crate::check_supported(&ctx, plain_copy).unwrap();
    assert!(!buft.accepts_weight(&ctx[packed], &[rgml::OpKind::GetRows]));
    assert!(buft.accepts_weight(&ctx[packed], &[rgml::OpKind::MulMat, rgml::OpKind::GetRows]));
}

/// MUL_MAT_ID's register tiles for the legacy types (several routed rows per expert) give
/// each output `vec_dot`'s bits, as ggml's `mul_mat_id` computes it.
#[test]
fn expert_tiles_give_the_pair_dots_bits() {
    use crate::kernels::blocks::activations::quantize_activations;
    use crate::kernels::dots::vec_dot;
    let f = crate::CpuFeatures::detect();
    let (k, n, n_expert, n_used, tokens) = (256, 12, 3, 2, 9);
    for dtype in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ] {
        let mut ctx = Context::new();
        let w = ctx.new_tensor(dtype, &[k, n, n_expert]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[k, n_used, tokens]).unwrap();
        let ids = ctx.new_tensor(DType::I32, &[n_used, tokens]).unwrap();
        let out = ctx.mul_mat_id(w, b, ids).unwrap();
        alloc_ctx_tensors(&mut ctx, &buffer_type()).unwrap();
        let wb = quantize(dtype, &rnd(k * n * n_expert, 60), k);
        ctx.tensor_set(w, 0, &wb).unwrap();
        let bv = fill(&ctx, b, 61);
        // Every expert gets 6 of the 18 routed rows.
        let route = |s: usize, t: usize| (t + 2 * s) % n_expert;
        let idv: Vec<u8> = (0..tokens)
            .flat_map(|t| (0..n_used).map(move |s| route(s, t) as i32))
            .flat_map(|i| i.to_le_bytes())
            .collect();
        ctx.tensor_set(ids, 0, &idv).unwrap();
        compute(&mut ctx, &[out], 2).unwrap();
        let got = read(&ctx, out);
        let vd = dtype.vec_dot_type();
        let rb = dtype.row_bytes(k).unwrap();
        for t in 0..tokens {
            for s in 0..n_used {
                let mut y = vec![0u8; vd.row_bytes(k).unwrap()];
                let row = &bv[(t * n_used + s) * k..][..k];
                quantize_activations(f, vd, row, &mut y).unwrap();
                let e = route(s, t);
                for r in 0..n {
                    let x = &wb[(e * n + r) * rb..][..rb];
                    let want = vec_dot(f, dtype, k, x, &y).unwrap();
                    let have = got[(t * n_used + s) * n + r];
                    assert_eq!(have.to_bits(), want.to_bits(), "{dtype} t{t} s{s} row {r}");
                }
            }
        }
    }
}
