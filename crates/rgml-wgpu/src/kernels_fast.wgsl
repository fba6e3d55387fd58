// The fast arithmetic's kernels (see `kernels.rs`): native f32 fused multiply-adds in whatever
// order the parallel work gives, workgroup-shared tiles and reductions. Prefixed with
// `common.wgsl`. The weight type is the pipeline constant TYPE, so each type's decoder is
// compiled into its own pipeline with no branch on the type at run time.
//
// Every weight type stores 8 consecutive elements of a row (at an element index that is a
// multiple of 8) in 8 consecutive quant bytes of one block, plus the block's scales: `deq8`
// decodes such a group in registers from two or four word reads, so a kernel reads each weight
// byte once.

@group(0) @binding(4) var<storage, read_write> D: array<u32>;

override TYPE: u32 = 0u;

// The non-linear 4-bit levels of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
var<private> IQ4_LEVELS: array<f32, 16> = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

// MXFP4's E2M1 levels, doubled (ggml's `kvalues_mxfp4`; the scale is halved to match).
var<private> MXFP4_LEVELS: array<f32, 16> = array<f32, 16>(
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

fn dset(i: u32, v: f32) { D[i] = bitcast<u32>(v); }

// Elements and bytes per block of TYPE (1 and the element size for the plain types).
fn block_elems() -> u32 {
    switch TYPE {
        case T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_IQ4_XS: { return 256u; }
        case T_F32, T_F16, T_BF16: { return 1u; }
        default: { return 32u; }
    }
}

fn block_bytes() -> u32 {
    switch TYPE {
        case T_F32: { return 4u; }
        case T_F16, T_BF16: { return 2u; }
        case T_Q4_0, T_IQ4_NL: { return 18u; }
        case T_MXFP4: { return 17u; }
        case T_Q4_1: { return 20u; }
        case T_Q5_0: { return 22u; }
        case T_Q5_1: { return 24u; }
        case T_Q8_0: { return 34u; }
        case T_Q2_K: { return 84u; }
        case T_Q3_K: { return 110u; }
        case T_Q4_K: { return 144u; }
        case T_Q5_K: { return 176u; }
        case T_Q6_K: { return 210u; }
        default: { return 136u; }
    }
}

// Eight consecutive decoded elements.
struct G8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Signed bytes: the bytes plus 128, less 128 (`u8x4` is in `convert.wgsl`).
fn i8x4(w: u32) -> vec4<f32> {
    return u8x4(w ^ 0x80808080u) - vec4<f32>(128.0);
}

// The four 4-bit fields at bit `sh` (0 or 4) of each byte of `w`.
fn nib4(w: u32, sh: u32) -> vec4<u32> {
    let n = (w >> sh) & 0x0f0f0f0fu;
    return vec4<u32>(n & 0xfu, (n >> 8u) & 0xfu, (n >> 16u) & 0xfu, n >> 24u);
}

// The four 2-bit fields at bit `sh` of each byte of `w`.
fn crumb4(w: u32, sh: u32) -> vec4<u32> {
    let n = (w >> sh) & 0x03030303u;
    return vec4<u32>(n & 3u, (n >> 8u) & 3u, (n >> 16u) & 3u, n >> 24u);
}

// Bit `b` of each of the four bytes of `w`, as 0 or 1.
fn bit4(w: u32, b: u32) -> vec4<u32> {
    return crumb4(w, b) & vec4<u32>(1u);
}

fn iq4(n: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(IQ4_LEVELS[n.x], IQ4_LEVELS[n.y], IQ4_LEVELS[n.z], IQ4_LEVELS[n.w]);
}

fn mxfp4(n: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(MXFP4_LEVELS[n.x], MXFP4_LEVELS[n.y], MXFP4_LEVELS[n.z], MXFP4_LEVELS[n.w]);
}

// Half the E8M0 scale `e`, 2^(e - 128), from its bits as ggml's `ggml_e8m0_to_fp32_half`
// builds it (subnormal below e = 2, which a device may flush to zero).
fn e8m0_half(e: u32) -> f32 {
    if (e < 2u) {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

// Elements k..k+8 of the plain-typed row at `base` (elements for f32, bytes otherwise; the row
// is contiguous), zero from `n` on.
fn plain8(base: u32, k: u32, n: u32) -> G8 {
    var v: array<f32, 8>;
    for (var e = 0u; e < 8u; e++) {
        let i = k + e;
        if (i < n) {
            switch TYPE {
                case T_F32: { v[e] = af(base + i); }
                case T_F16: { v[e] = a_f16(base + 2u * i); }
                default: {
                    let b = base + 2u * i;
                    v[e] = bitcast<f32>(((A[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu) << 16u);
                }
            }
        }
    }
    return G8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// Scale and min of sub-block `sb` (0..8) of a Q4_K / Q5_K block at byte `blk` (ggml's
// `get_scale_min_k4`: 6-bit values packed in 12 bytes from byte 4).
fn scale_min_k4(blk: u32, sb: u32) -> vec2<f32> {
    if (sb < 4u) {
        return vec2<f32>(f32(a_u8(blk + 4u + sb) & 63u), f32(a_u8(blk + 8u + sb) & 63u));
    }
    let sc = (a_u8(blk + 8u + sb) & 0xfu) | ((a_u8(blk + sb) >> 6u) << 4u);
    let mn = (a_u8(blk + 8u + sb) >> 4u) | ((a_u8(blk + 4u + sb) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

// Scale `i` (0..16) of a Q3_K block at byte `blk`: 6-bit values packed in 12 bytes from byte
// 96 (low 4 bits in bytes 0..8, two nibbles each; high 2 bits in bytes 8..12), minus 32.
fn scale_q3k(blk: u32, i: u32) -> f32 {
    let s = blk + 96u;
    let low = select(a_u8(s + i) & 0xfu, a_u8(s + i - 8u) >> 4u, i >= 8u);
    let high = (a_u8(s + 8u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

// Elements k..k+8 (k a multiple of 8) of the TYPE row at byte `base` (elements for f32) whose
// length is `n`.
fn deq8(base: u32, k: u32, n: u32) -> G8 {
    if (TYPE == T_F32 || TYPE == T_F16 || TYPE == T_BF16) {
        return plain8(base, k, n);
    }
    let blk = base + (k / block_elems()) * block_bytes();
    let j = k % block_elems();
    switch TYPE {
        case T_Q4_0, T_Q4_1, T_IQ4_NL: {
            // d (f16), [m (f16),] 16 bytes: elements 0..16 low nibbles, 16..32 high.
            let qs = blk + select(2u, 4u, TYPE == T_Q4_1) + j % 16u;
            let sh = select(0u, 4u, j >= 16u);
            let n0 = nib4(a_u32(qs), sh);
            let n1 = nib4(a_u32(qs + 4u), sh);
            let d = a_f16(blk);
            if (TYPE == T_IQ4_NL) {
                return G8(iq4(n0) * d, iq4(n1) * d);
            }
            if (TYPE == T_Q4_1) {
                let m = a_f16(blk + 2u);
                return G8(u4f(n0) * d + m, u4f(n1) * d + m);
            }
            return G8((u4f(n0) - 8.0) * d, (u4f(n1) - 8.0) * d);
        }
        case T_Q5_0, T_Q5_1: {
            // d, [m,] 32 high bits (bit e for element e), 16 bytes of low nibbles as Q4_0.
            let q1 = TYPE == T_Q5_1;
            let qh = a_u32(blk + select(2u, 4u, q1)) >> j;
            let qs = blk + select(6u, 8u, q1) + j % 16u;
            let sh = select(0u, 4u, j >= 16u);
            let hb0 = vec4<u32>(qh & 1u, (qh >> 1u) & 1u, (qh >> 2u) & 1u, (qh >> 3u) & 1u);
            let hb1 = vec4<u32>((qh >> 4u) & 1u, (qh >> 5u) & 1u, (qh >> 6u) & 1u, (qh >> 7u) & 1u);
            let v0 = u4f(nib4(a_u32(qs), sh) | (hb0 << vec4<u32>(4u)));
            let v1 = u4f(nib4(a_u32(qs + 4u), sh) | (hb1 << vec4<u32>(4u)));
            let d = a_f16(blk);
            if (q1) {
                let m = a_f16(blk + 2u);
                return G8(v0 * d + m, v1 * d + m);
            }
            return G8((v0 - 16.0) * d, (v1 - 16.0) * d);
        }
        case T_MXFP4: {
            // e (E8M0), 16 bytes of E2M1 codes: elements 0..16 low nibbles, 16..32 high.
            let qs = blk + 1u + j % 16u;
            let sh = select(0u, 4u, j >= 16u);
            let d = e8m0_half(a_u8(blk));
            return G8(mxfp4(nib4(a_u32(qs), sh)) * d, mxfp4(nib4(a_u32(qs + 4u), sh)) * d);
        }
        case T_Q8_0: {
            let d = a_f16(blk);
            return G8(i8x4(a_u32(blk + 2u + j)) * d, i8x4(a_u32(blk + 6u + j)) * d);
        }
        case T_Q2_K: {
            // 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit quants, d,
            // dmin: element 128 n + 32 s + l is bits 2s of byte 32 n + l, scale 8 n + 2 s + l / 16.
            let h = j / 128u;
            let s = (j % 128u) / 32u;
            let l = j % 32u;
            let sc = a_u8(blk + 8u * h + 2u * s + l / 16u);
            let dl = a_f16(blk + 80u) * f32(sc & 0xfu);
            let ml = a_f16(blk + 82u) * f32(sc >> 4u);
            let qs = blk + 16u + 32u * h + l;
            return G8(
                u4f(crumb4(a_u32(qs), 2u * s)) * dl - ml,
                u4f(crumb4(a_u32(qs + 4u), 2u * s)) * dl - ml);
        }
        case T_Q3_K: {
            // 32 bytes of high-bit masks, 64 of 2-bit quants (as Q2_K), 12 of scales, d: the
            // quant loses 4 where its mask bit (4 n + s of byte l) is clear.
            let h = j / 128u;
            let s = (j % 128u) / 32u;
            let l = j % 32u;
            let dl = a_f16(blk + 108u) * scale_q3k(blk, 8u * h + 2u * s + l / 16u);
            let qs = blk + 32u + 32u * h + l;
            let mb = 4u * h + s;
            // The mask bit as the quant's bit 2 (q + 4 bit - 4): one conversion per element
            // (see `convert.wgsl` on combining converted values).
            let q0 = u4f(crumb4(a_u32(qs), 2u * s) | (bit4(a_u32(blk + l), mb) << vec4<u32>(2u))) - 4.0;
            let q1 = u4f(crumb4(a_u32(qs + 4u), 2u * s) | (bit4(a_u32(blk + l + 4u), mb) << vec4<u32>(2u))) - 4.0;
            return G8(q0 * dl, q1 * dl);
        }
        case T_Q4_K, T_Q5_K: {
            // d, dmin, 12 bytes of scales and mins, [32 bytes of high bits,] 128 bytes of
            // nibbles: 64 elements per 32 bytes, low nibbles first.
            let sb = j / 32u;
            let l = j % 32u;
            let sm = scale_min_k4(blk, sb);
            let d = a_f16(blk) * sm.x;
            let m = a_f16(blk + 2u) * sm.y;
            let q5 = TYPE == T_Q5_K;
            let qs = blk + select(16u, 48u, q5) + (j / 64u) * 32u + l;
            let sh = select(0u, 4u, (j % 64u) >= 32u);
            var n0 = nib4(a_u32(qs), sh);
            var n1 = nib4(a_u32(qs + 4u), sh);
            if (q5) {
                n0 = n0 | (bit4(a_u32(blk + 16u + l), sb) << vec4<u32>(4u));
                n1 = n1 | (bit4(a_u32(blk + 20u + l), sb) << vec4<u32>(4u));
            }
            return G8(u4f(n0) * d - m, u4f(n1) * d - m);
        }
        case T_Q6_K: {
            // 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed scales, d.
            let h = j / 128u;
            let quarter = (j % 128u) / 32u;
            let l = j % 32u;
            let ql = blk + 64u * h + l + (quarter & 1u) * 32u;
            let sh = select(0u, 4u, quarter >= 2u);
            let qh = blk + 128u + 32u * h + l;
            let q0 = nib4(a_u32(ql), sh) | (crumb4(a_u32(qh), 2u * quarter) << vec4<u32>(4u));
            let q1 = nib4(a_u32(ql + 4u), sh) | (crumb4(a_u32(qh + 4u), 2u * quarter) << vec4<u32>(4u));
            let s = a_u8(blk + 192u + 8u * h + l / 16u + 2u * quarter);
            let d = a_f16(blk + 208u) * f32(select(i32(s), i32(s) - 256, s >= 128u));
            return G8((u4f(q0) - 32.0) * d, (u4f(q1) - 32.0) * d);
        }
        default: {
            // IQ4_XS: d, 16 high scale bits, 4 bytes of low scale nibbles, then per 32-element
            // sub-block 16 bytes of nibbles (low first) into the IQ4_NL levels.
            let ib = j / 32u;
            let l = j % 32u;
            let lo = (a_u8(blk + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu;
            let hi = ((a_u8(blk + 2u + ib / 4u) >> (2u * (ib % 4u))) & 3u);
            let d = a_f16(blk) * f32(i32(lo | (hi << 4u)) - 32);
            let qs = blk + 8u + 16u * ib + l % 16u;
            let sh = select(0u, 4u, l >= 16u);
            return G8(iq4(nib4(a_u32(qs), sh)) * d, iq4(nib4(a_u32(qs + 4u), sh)) * d);
        }
    }
}

// Elements k..k+8 of the f32 activation row at element `b0` (element stride b_nb.x), zero from
// `n` on. Contiguous rows away from their end take eight plain loads with no branch between
// them, so a thread's loads are all in flight at once.
fn act8(b0: u32, k: u32, n: u32) -> G8 {
    if (p.b_nb.x == 1u && k + 8u <= n) {
        let i = b0 + k;
        return G8(vec4<f32>(bf(i), bf(i + 1u), bf(i + 2u), bf(i + 3u)),
                  vec4<f32>(bf(i + 4u), bf(i + 5u), bf(i + 6u), bf(i + 7u)));
    }
    var v: array<f32, 8>;
    for (var e = 0u; e < 8u; e++) {
        if (k + e < n) {
            v[e] = bf(b0 + (k + e) * p.b_nb.x);
        }
    }
    return G8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// The groups of 8 elements k + 256 u (u = 0..4) of a weight row: what one invocation of
// `mul_mv_fast` takes in one step. Invocation t of a row starts at group t, so for each u the
// row's 32 invocations read 32 neighbouring groups (their loads coalesce), and the four groups'
// loads are in flight together (a mat-vec is bound by loads in flight, not by arithmetic).
struct Step4 {
    g0: G8,
    g1: G8,
    g2: G8,
    g3: G8,
}

// Elements between invocations' groups in a step of `mul_mv_fast`: 8 x MV_THREADS.
const MV_SPAN: u32 = 256u;

// Group k of the TYPE row at `a0` (length n), zero past the row's end.
fn deq8_in(a0: u32, k: u32, n: u32) -> G8 {
    if (k < n) {
        return deq8(a0, k, n);
    }
    return G8(vec4<f32>(0.0), vec4<f32>(0.0));
}

fn deq_step(a0: u32, k: u32, n: u32) -> Step4 {
    return Step4(deq8_in(a0, k, n), deq8_in(a0, k + MV_SPAN, n),
                 deq8_in(a0, k + 2u * MV_SPAN, n), deq8_in(a0, k + 3u * MV_SPAN, n));
}

fn dot8(x: G8, y: G8) -> f32 {
    return dot(x.lo, y.lo) + dot(x.hi, y.hi);
}

// The dot product of a step's decoded weights with activation row `b0` (zero past n).
fn dot_step(x: Step4, b0: u32, k: u32, n: u32) -> f32 {
    let y0 = act8(b0, k, n);
    let y1 = act8(b0, k + MV_SPAN, n);
    let y2 = act8(b0, k + 2u * MV_SPAN, n);
    let y3 = act8(b0, k + 3u * MV_SPAN, n);
    return (dot8(x.g0, y0) + dot8(x.g1, y1)) + (dot8(x.g2, y2) + dot8(x.g3, y3));
}

// The weight row (A) of output row `i0` in the matrix of batch indices (i2, i3): dims 2 and 3
// broadcast by misc.y and misc.z.
fn weight_row(i0: u32, i2: u32, i3: u32) -> u32 {
    return p.off.x + i0 * p.a_nb.y + (i2 / p.misc.y) * p.a_nb.z + (i3 / p.misc.z) * p.a_nb.w;
}

fn act_row(i1: u32, i2: u32, i3: u32) -> u32 {
    return p.off.y + i1 * p.b_nb.y + i2 * p.b_nb.z + i3 * p.b_nb.w;
}

// Threads per row of `mul_mv_fast` and the most activation columns it takes at once.
const MV_THREADS: u32 = 32u;
const MV_COLS: u32 = 8u;

var<workgroup> partial: array<f32, 512>;

// MUL_MAT with few activation columns (B's ne1 <= MV_COLS: generation): a workgroup of 64
// computes two weight rows for every column, 32 invocations per row, each taking every 32nd
// group of 8 elements, four groups per step (see `Step4`), so a row's bytes are read once,
// side by side, with four loads in flight per invocation; then a subgroup
// sum where a row's invocations are one subgroup (`SUBGROUP_ROWS`, prefixed by `kernels.rs`),
// else a tree sum through workgroup memory. Workgroup w: rows 2 (w % ceil(ne0 / 2)) .. + 2 of matrix w / ceil(ne0 / 2)
// (i2 + ne2 i3).
@compute @workgroup_size(64)
fn mul_mv_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let pairs = (p.d_ne.x + 1u) / 2u;
    let mat = w / pairs;
    let i2 = mat % p.d_ne.z;
    let i3 = mat / p.d_ne.z;
    let i0 = 2u * (w % pairs) + li / MV_THREADS;
    let t = li % MV_THREADS;
    let ncols = min(p.d_ne.y, MV_COLS);
    let n = p.a_ne.x;
    var acc: array<f32, MV_COLS>;
    if (i0 < p.d_ne.x && i3 < p.d_ne.w) {
        let a0 = weight_row(i0, i2, i3);
        for (var k = 8u * t; k < n; k += 4u * MV_SPAN) {
            let x = deq_step(a0, k, n);
            for (var c = 0u; c < ncols; c++) {
                acc[c] += dot_step(x, act_row(c, i2, i3), k, n);
            }
        }
    }
    if (SUBGROUP_ROWS) {
        // A row's 32 invocations are one subgroup: its sum needs no workgroup memory.
        for (var c = 0u; c < ncols; c++) {
            let total = row_total(acc[c]);
            if (t == 0u && i0 < p.d_ne.x && i3 < p.d_ne.w) {
                dset(p.off.w + i0 * p.d_nb.x + c * p.d_nb.y + i2 * p.d_nb.z + i3 * p.d_nb.w, total);
            }
        }
        return;
    }
    for (var c = 0u; c < ncols; c++) {
        partial[c * 64u + li] = acc[c];
    }
    workgroupBarrier();
    for (var s = MV_THREADS / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            for (var c = 0u; c < ncols; c++) {
                partial[c * 64u + li] += partial[c * 64u + li + s];
            }
        }
        workgroupBarrier();
    }
    if (t == 0u && i0 < p.d_ne.x && i3 < p.d_ne.w) {
        for (var c = 0u; c < ncols; c++) {
            dset(p.off.w + i0 * p.d_nb.x + c * p.d_nb.y + i2 * p.d_nb.z + i3 * p.d_nb.w, partial[c * 64u + li]);
        }
    }
}

// MUL_MAT_ID (expert products) in the fast arithmetic, one activation column per workgroup:
// as `mul_mv_fast`, two weight rows of expert ids[e, t] (C: I32 [n_used, n_tokens]) times the
// activation row b[:, e % ne11, t], the result's column (e, t). An expert index outside the
// weights (ggml asserts there) gives NaN, never a read elsewhere. Workgroup w: rows
// 2 (w % ceil(ne0 / 2)) .. + 2 of column w / ceil(ne0 / 2) = e + n_used t.
@compute @workgroup_size(64)
fn mul_mv_id_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let pairs = (p.d_ne.x + 1u) / 2u;
    let col = w / pairs;
    let e = col % p.d_ne.y;
    let tok = col / p.d_ne.y;
    let i0 = 2u * (w % pairs) + li / MV_THREADS;
    let t = li % MV_THREADS;
    let n = p.a_ne.x;
    let live = i0 < p.d_ne.x && tok < p.d_ne.z;
    var acc = 0.0;
    var bad = false;
    if (live) {
        let expert = bitcast<i32>(C[p.off.z + e * p.c_nb.x + tok * p.c_nb.y]);
        bad = expert < 0 || u32(expert) >= p.a_ne.z;
        if (!bad) {
            let a0 = p.off.x + i0 * p.a_nb.y + u32(expert) * p.a_nb.z;
            let b0 = p.off.y + (e % p.b_ne.y) * p.b_nb.y + tok * p.b_nb.z;
            for (var k = 8u * t; k < n; k += 4u * MV_SPAN) {
                acc += dot_step(deq_step(a0, k, n), b0, k, n);
            }
        }
    }
    var total = 0.0;
    if (SUBGROUP_ROWS) {
        total = row_total(acc);
    } else {
        partial[li] = acc;
        workgroupBarrier();
        for (var s = MV_THREADS / 2u; s > 0u; s >>= 1u) {
            if (t < s) {
                partial[li] += partial[li + s];
            }
            workgroupBarrier();
        }
        total = partial[li];
    }
    if (t == 0u && live) {
        let at = p.off.w + i0 * p.d_nb.x + e * p.d_nb.y + tok * p.d_nb.z;
        dset(at, select(total, bitcast<f32>(0x7fc00000u), bad));
    }
}

// f16's largest finite value: activations beyond it are clamped rather than made infinite.
const F16_MAX: f32 = 65504.0;

// The activations of a `mul_mm_coop` product (B: f32, any strides) as f16, once per product
// rather than once per tile: column n of matrix (i2, i3) to word ((i3 ne2 + i2) ne1 + n) K / 2
// of D, two elements per word (K even; the host checks).
@compute @workgroup_size(64)
fn to_f16_fast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let half_k = p.b_ne.x / 2u;
    let k = 2u * (i % half_k);
    let col = i / half_k;
    let n = col % p.b_ne.y;
    let i2 = (col / p.b_ne.y) % p.b_ne.z;
    let i3 = col / (p.b_ne.y * p.b_ne.z);
    let b0 = p.off.y + n * p.b_nb.y + i2 * p.b_nb.z + i3 * p.b_nb.w;
    let v = vec2<f32>(bf(b0 + k * p.b_nb.x), bf(b0 + (k + 1u) * p.b_nb.x));
    D[i] = pack2x16float(clamp(v, vec2<f32>(-F16_MAX), vec2<f32>(F16_MAX)));
}

// Tile edge (outputs) and depth (elements of k) of `mul_mm_fast`.
const TILE: u32 = 64u;
const DEPTH: u32 = 32u;

// The tiles of one step, k-major: vec4 `k * 16 + r / 4` holds rows (or columns) r..r+4 of
// element k, so an invocation reads its 8 rows of one k with two 16-byte loads.
var<workgroup> tile_a: array<vec4<f32>, 512>;
var<workgroup> tile_b: array<vec4<f32>, 512>;

// The 64 x 64 output tile of a mat-mat workgroup: tile w % tiles of matrix w / tiles (i2 + ne2
// i3), its first row m0 and column n0; `live` is false for a padding workgroup (none unless the
// grid is padded), which still reaches every barrier.
// A workgroup's 64 x 64 tile: weight rows m0.., activation columns n0.. of matrix (i2, i3);
// `routed` (MUL_MAT_ID, `mul_mm_id_fast`): rows of expert i2, the columns entries n0.. of the
// expert's list (`mm_id_lists`), each a (slot, token) column.
struct TileAt {
    i2: u32,
    i3: u32,
    m0: u32,
    n0: u32,
    live: bool,
    routed: bool,
}

fn tile_of_workgroup(w: u32) -> TileAt {
    let tiles_m = (p.d_ne.x + TILE - 1u) / TILE;
    let tiles_n = (p.d_ne.y + TILE - 1u) / TILE;
    let tiles = tiles_m * tiles_n;
    let mat = w / tiles;
    let i3 = mat / p.d_ne.z;
    return TileAt(mat % p.d_ne.z, i3, (w % tiles_m) * TILE, ((w % tiles) / tiles_m) * TILE, i3 < p.d_ne.w, false);
}

// MUL_MAT_ID's columns (slot s, token t) as `c = t * n_used + s`: the capacity of an expert's
// list (every column, should one token route several slots to it), and the list's entry j of
// expert e in C: counts at words 0..E + 1, then one list of `id_capacity()` per expert and a
// last one (e = E) of the columns whose id is no expert.
fn id_capacity() -> u32 {
    return p.d_ne.y * p.d_ne.z;
}

fn id_column(e: u32, j: u32) -> u32 {
    return C[p.off.z + p.a_ne.z + 1u + e * id_capacity() + j];
}

// The routed tile of workgroup w (expert, row tile, column tile over the expert's list), live
// when the expert's list reaches column n0; `count`: the expert's list length.
fn routed_tile(w: u32, count: u32) -> TileAt {
    let tiles_m = (p.d_ne.x + TILE - 1u) / TILE;
    let tiles_n = (id_capacity() + TILE - 1u) / TILE;
    let tiles = tiles_m * tiles_n;
    let e = w / tiles;
    let n0 = ((w % tiles) / tiles_m) * TILE;
    return TileAt(e, 0u, (w % tiles_m) * TILE, n0, e < p.a_ne.z && n0 < count, true);
}

// The activation row of tile column `col` (its column index for a plain tile, its list entry
// for a routed one) and whether it exists.
fn tile_act_row(at: TileAt, col: u32) -> vec2<u32> {
    if (at.routed) {
        let c = id_column(at.i2, col);
        let s = c % p.d_ne.y;
        return vec2<u32>(act_row(s % p.b_ne.y, c / p.d_ne.y, 0u), 1u);
    }
    return vec2<u32>(act_row(col, at.i2, at.i3), u32(col < p.d_ne.y));
}

// Elements k..k+8 of weight row m0 + row and of activation column n0 + row of a tile: what a
// mat-mat invocation stages (zeros beyond the matrices' edges and in padding workgroups).
struct TileFetch {
    x: G8,
    y: G8,
}

fn tile_fetch(row: u32, k: u32, at: TileAt, cols: u32) -> TileFetch {
    let n = p.a_ne.x;
    var y = G8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (at.live && at.n0 + row < cols && k < n) {
        let b = tile_act_row(at, at.n0 + row);
        if (b.y == 1u) {
            y = act8(b.x, k, n);
        }
    }
    return TileFetch(tile_weights(row, k, at), y);
}

// Elements k..k+8 of weight row m0 + row of a tile (zeros beyond the matrix and in padding
// workgroups).
fn tile_weights(row: u32, k: u32, at: TileAt) -> G8 {
    let n = p.a_ne.x;
    if (at.live && at.m0 + row < p.d_ne.x && k < n) {
        return deq8(weight_row(at.m0 + row, at.i2, at.i3), k, n);
    }
    return G8(vec4<f32>(0.0), vec4<f32>(0.0));
}

// Output (row i0, column i1) of tile `at`'s matrix, if inside the result (a routed tile's
// column i1 is entry i1 of its expert's list, of `cols`).
fn tile_set(at: TileAt, i0: u32, i1: u32, v: f32, cols: u32) {
    if (at.routed) {
        if (i0 < p.d_ne.x && i1 < cols) {
            let c = id_column(at.i2, i1);
            dset(p.off.w + i0 * p.d_nb.x + (c % p.d_ne.y) * p.d_nb.y + (c / p.d_ne.y) * p.d_nb.z, v);
        }
        return;
    }
    if (i0 < p.d_ne.x && i1 < p.d_ne.y) {
        dset(p.off.w + i0 * p.d_nb.x + i1 * p.d_nb.y + at.i2 * p.d_nb.z + at.i3 * p.d_nb.w, v);
    }
}

// Row i0 of an invocation's 8 x 8 outputs, columns n0..n0+8: `lo` and `hi` hold 0..4, 4..8.
fn mm_store(at: TileAt, i0: u32, n0: u32, lo: vec4<f32>, hi: vec4<f32>, cols: u32) {
    for (var j = 0u; j < 4u; j++) {
        tile_set(at, i0, n0 + j, lo[j], cols);
        tile_set(at, i0, n0 + 4u + j, hi[j], cols);
    }
}

// MUL_MAT with many activation columns (prompts): a workgroup of 64 computes a 64 x 64 tile of
// outputs, 8 x 8 per invocation (rows 8 tx .. + 8, columns 8 ty .. + 8), over steps of 32
// elements: each step decodes the tile's 64 weight rows into workgroup memory (4 groups of 8
// per invocation; neighbouring invocations take neighbouring rows, so their stores hit distinct
// banks) and loads the 64 activation columns beside them; then 32 rank-1 updates of the
// register tile with native `fma`, the 64 sums held in 16 named vec4 variables (an array
// indexed in loops would live in memory). Workgroup w: tile w % tiles of matrix w / tiles.
@compute @workgroup_size(64)
fn mul_mm_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    mm_tile(li, tile_of_workgroup(wid.x + wid.y * nwg.x), p.d_ne.y);
}

var<workgroup> id_count: u32;

// MUL_MAT_ID with many columns (prompts), after `mm_id_lists`: `mul_mm_fast`'s tile over one
// expert's rows and the columns routed to it (C: the lists), so each expert's weights are
// decoded once per 64 of its columns instead of once per column. Workgroup w: expert
// w / tiles, tile w % tiles of its rows by its list's capacity; a tile past the list's end
// leaves at once (the count read uniformly, so the barriers stay in uniform control flow).
@compute @workgroup_size(64)
fn mul_mm_id_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let tiles_m = (p.d_ne.x + TILE - 1u) / TILE;
    let tiles_n = (id_capacity() + TILE - 1u) / TILE;
    let e = min(w / (tiles_m * tiles_n), p.a_ne.z);
    if (li == 0u) {
        id_count = C[p.off.z + e];
    }
    let count = workgroupUniformLoad(&id_count);
    var at = routed_tile(w, count);
    if (e == p.a_ne.z && (w % (tiles_m * tiles_n)) / tiles_m * TILE < count) {
        // Columns whose id is no expert: NaN, as `mul_mv_id_fast` gives them.
        at.i2 = e;
        for (var i = li; i < TILE * TILE; i += 64u) {
            tile_set(at, at.m0 + i % TILE, at.n0 + i / TILE, bitcast<f32>(0x7fc00000u), count);
        }
        return;
    }
    if (!at.live) {
        return;
    }
    mm_tile(li, at, count);
}

var<workgroup> list_len: atomic<u32>;

// MUL_MAT_ID's routing as lists, one workgroup per expert e: the columns c = t * n_used + s
// whose id (C: ids [n_used, n_tokens], i32) is e, appended in any order (each column's sums
// do not depend on its place), then the count; workgroup E lists the ids outside 0..E. D:
// counts at words 0..E + 1, lists after them (`id_column`). a_ne.z: E; c_ne.xy: n_used,
// n_tokens.
@compute @workgroup_size(64)
fn mm_id_lists(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = wid.x + wid.y * nwg.x;
    if (li == 0u) {
        atomicStore(&list_len, 0u);
    }
    workgroupBarrier();
    let n_used = p.c_ne.x;
    let columns = n_used * p.c_ne.y;
    let experts = p.a_ne.z;
    if (e <= experts) {
        for (var c = li; c < columns; c += 64u) {
            let id = bitcast<i32>(C[p.off.z + (c % n_used) * p.c_nb.x + (c / n_used) * p.c_nb.y]);
            let none = id < 0 || u32(id) >= experts;
            if ((e < experts && id == i32(e)) || (e == experts && none)) {
                let j = atomicAdd(&list_len, 1u);
                D[p.off.w + experts + 1u + e * columns + j] = c;
            }
        }
    }
    workgroupBarrier();
    if (e <= experts && li == 0u) {
        D[p.off.w + e] = atomicLoad(&list_len);
    }
}

// One 64 x 64 tile of `mul_mm_fast` / `mul_mm_id_fast` (`cols`: the matrix's columns, or the
// expert's list length).
fn mm_tile(li: u32, at: TileAt, cols: u32) {
    let tx = li % 8u;
    let ty = li / 8u;
    let n = p.a_ne.x;
    var c0a = vec4<f32>(0.0); var c0b = vec4<f32>(0.0);
    var c1a = vec4<f32>(0.0); var c1b = vec4<f32>(0.0);
    var c2a = vec4<f32>(0.0); var c2b = vec4<f32>(0.0);
    var c3a = vec4<f32>(0.0); var c3b = vec4<f32>(0.0);
    var c4a = vec4<f32>(0.0); var c4b = vec4<f32>(0.0);
    var c5a = vec4<f32>(0.0); var c5b = vec4<f32>(0.0);
    var c6a = vec4<f32>(0.0); var c6b = vec4<f32>(0.0);
    var c7a = vec4<f32>(0.0); var c7b = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < n; k0 += DEPTH) {
        for (var r = 0u; r < 4u; r++) {
            let row = li;
            let kg = 8u * r;
            let g = tile_fetch(row, k0 + kg, at, cols);
            let x = g.x;
            let y = g.y;
            for (var e = 0u; e < 4u; e++) {
                tile_a[(kg + e) * 16u + row / 4u][row % 4u] = x.lo[e];
                tile_a[(kg + 4u + e) * 16u + row / 4u][row % 4u] = x.hi[e];
                tile_b[(kg + e) * 16u + row / 4u][row % 4u] = y.lo[e];
                tile_b[(kg + 4u + e) * 16u + row / 4u][row % 4u] = y.hi[e];
            }
        }
        workgroupBarrier();
        for (var k = 0u; k < DEPTH; k++) {
            let a0 = tile_a[k * 16u + 2u * tx];
            let a1 = tile_a[k * 16u + 2u * tx + 1u];
            let b0 = tile_b[k * 16u + 2u * ty];
            let b1 = tile_b[k * 16u + 2u * ty + 1u];
            c0a = fma(vec4<f32>(a0.x), b0, c0a); c0b = fma(vec4<f32>(a0.x), b1, c0b);
            c1a = fma(vec4<f32>(a0.y), b0, c1a); c1b = fma(vec4<f32>(a0.y), b1, c1b);
            c2a = fma(vec4<f32>(a0.z), b0, c2a); c2b = fma(vec4<f32>(a0.z), b1, c2b);
            c3a = fma(vec4<f32>(a0.w), b0, c3a); c3b = fma(vec4<f32>(a0.w), b1, c3b);
            c4a = fma(vec4<f32>(a1.x), b0, c4a); c4b = fma(vec4<f32>(a1.x), b1, c4b);
            c5a = fma(vec4<f32>(a1.y), b0, c5a); c5b = fma(vec4<f32>(a1.y), b1, c5b);
            c6a = fma(vec4<f32>(a1.z), b0, c6a); c6b = fma(vec4<f32>(a1.z), b1, c6b);
            c7a = fma(vec4<f32>(a1.w), b0, c7a); c7b = fma(vec4<f32>(a1.w), b1, c7b);
        }
        workgroupBarrier();
    }
    if (!at.live) {
        return;
    }
    let r0 = at.m0 + 8u * tx;
    let col = at.n0 + 8u * ty;
    mm_store(at, r0, col, c0a, c0b, cols);
    mm_store(at, r0 + 1u, col, c1a, c1b, cols);
    mm_store(at, r0 + 2u, col, c2a, c2b, cols);
    mm_store(at, r0 + 3u, col, c3a, c3b, cols);
    mm_store(at, r0 + 4u, col, c4a, c4b, cols);
    mm_store(at, r0 + 5u, col, c5a, c5b, cols);
    mm_store(at, r0 + 6u, col, c6a, c6b, cols);
    mm_store(at, r0 + 7u, col, c7a, c7b, cols);
}

// Invocations per row of the per-row kernels (`rms_norm_fast`, `soft_max_fast`): a decode
// step has a single row, so a row must keep many loads in flight at once.
const ROW_WG: u32 = 256u;

var<workgroup> row_sum: array<f32, 256>;

// The sum (or, with `maximum`, the largest) of every invocation's `v` over the workgroup of
// ROW_WG; every invocation gets it.
fn workgroup_reduce(li: u32, v: f32, maximum: bool) -> f32 {
    row_sum[li] = v;
    workgroupBarrier();
    for (var s = ROW_WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            let other = row_sum[li + s];
            row_sum[li] = select(row_sum[li] + other, max(row_sum[li], other), maximum);
        }
        workgroupBarrier();
    }
    let total = row_sum[0];
    workgroupBarrier();
    return total;
}

// The row of A (and D) a workgroup of the per-row kernels takes: `live` is false for a padding
// workgroup beyond the last row, which still reaches every barrier (on the last row's indices).
struct RowAt {
    live: bool,
    row: vec4<u32>,
    a0: u32,
    d0: u32,
}

fn row_of_workgroup(r: u32) -> RowAt {
    let rows = p.a_ne.y * p.a_ne.z * p.a_ne.w;
    let row = unravel_row(min(r, rows - 1u), p.a_ne);
    return RowAt(r < rows, row, p.off.x + at(row, p.a_nb), p.off.w + at(row, p.d_nb));
}

// RMS_NORM, one workgroup of ROW_WG per row (workgroup r: row r): x / sqrt(mean(x^2) + f.x).
// Each invocation reads its elements once, keeping up to 16 in registers for the write (rows of
// up to 4096 elements; longer rows read the rest again). misc.y chooses what else it does, as
// llama.cpp's Vulkan backend fuses these nodes:
//   0: RMS_NORM alone, A to D;
//   1: with the MUL by a row of weights (C, broadcast over rows) that follows it: the norm to
//      D's buffer at misc.w, the product at D;
//   2: as 1, of the ADD of A and B before it: the sum to D's buffer at misc.z too.
// Every output has D's strides. An invocation writes the elements it read, after the row's sum
// (a barrier), the sum, then the norm, then the product: outputs may share memory with the
// inputs or each other element for element (in place).
@compute @workgroup_size(256)
fn rms_norm_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = row_of_workgroup(wid.x + wid.y * nwg.x);
    let b0 = p.off.y + at(w.row, p.b_nb);
    var x: array<f32, 16>;
    var sum = 0.0;
    if (w.live) {
        for (var j = 0u; j < 16u; j++) {
            let k = li + j * ROW_WG;
            if (k < p.a_ne.x) {
                x[j] = rms_norm_input(w.a0, b0, k);
            }
        }
        for (var j = 0u; j < 16u; j++) {
            sum = fma(x[j], x[j], sum);
        }
        for (var k = li + 16u * ROW_WG; k < p.a_ne.x; k += ROW_WG) {
            let v = rms_norm_input(w.a0, b0, k);
            sum = fma(v, v, sum);
        }
    }
    let s = inverseSqrt(workgroup_reduce(li, sum, false) / f32(p.a_ne.x) + p.f.x);
    if (w.live) {
        let row = at(w.row, p.d_nb);
        for (var j = 0u; j < 16u; j++) {
            let k = li + j * ROW_WG;
            if (k < p.a_ne.x) {
                rms_norm_store(row, k, x[j], s);
            }
        }
        for (var k = li + 16u * ROW_WG; k < p.a_ne.x; k += ROW_WG) {
            rms_norm_store(row, k, rms_norm_input(w.a0, b0, k), s);
        }
    }
}

// Element k of the row to normalize: A's, or with misc.y = 2 the sum of A's and B's.
fn rms_norm_input(a0: u32, b0: u32, k: u32) -> f32 {
    let v = af(a0 + k * p.a_nb.x);
    if (p.misc.y == 2u) {
        return v + bf(b0 + k * p.b_nb.x);
    }
    return v;
}

// Element k (of the row at `row` in D's strides) of input `v`, normalized by `s`: to D, or
// fused (misc.y > 0) the sum, the norm and its product with the weights (see `rms_norm_fast`).
fn rms_norm_store(row: u32, k: u32, v: f32, s: f32) {
    let i = row + k * p.d_nb.x;
    if (p.misc.y == 0u) {
        dset(p.off.w + i, v * s);
        return;
    }
    if (p.misc.y == 2u) {
        dset(p.misc.z + i, v);
    }
    dset(p.misc.w + i, v * s);
    dset(p.off.w + i, v * s * cf(p.off.z + k * p.c_nb.x));
}

// SUM_ROWS, one workgroup of ROW_WG per row (workgroup r: row r): the row's elements summed in
// f32 in the workgroup's order, to element 0 of D's row.
@compute @workgroup_size(256)
fn sum_rows_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = row_of_workgroup(wid.x + wid.y * nwg.x);
    var sum = 0.0;
    if (w.live) {
        for (var k = li; k < p.a_ne.x; k += ROW_WG) {
            sum += af(w.a0 + k * p.a_nb.x);
        }
    }
    let total = workgroup_reduce(li, sum, false);
    if (w.live && li == 0u) {
        dset(w.d0, total);
    }
}

// ARGSORT, one workgroup of ROW_WG per row: each element's place is the count of the row's
// elements before it in the order (larger first with misc.y = 1, else smaller first; equal
// values by index, so ties keep their order), and D's element at that place gets its index.
// Quadratic in the row's length, which `ops::supports_op` bounds (routers' rows of experts).
@compute @workgroup_size(256)
fn argsort_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = row_of_workgroup(wid.x + wid.y * nwg.x);
    if (!w.live) {
        return;
    }
    let n = p.a_ne.x;
    let descending = p.misc.y == 1u;
    for (var i = li; i < n; i += ROW_WG) {
        let v = af(w.a0 + i * p.a_nb.x);
        var place = 0u;
        for (var j = 0u; j < n; j++) {
            let u = af(w.a0 + j * p.a_nb.x);
            let before = select((u < v), (u > v), descending) || (u == v && j < i);
            place += u32(before);
        }
        D[w.d0 + place * p.d_nb.x] = i;
    }
}

// SOFT_MAX, one workgroup of ROW_WG per row, with `soft_max`'s inputs (scale, mask, ALiBi).
@compute @workgroup_size(256)
fn soft_max_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = row_of_workgroup(wid.x + wid.y * nwg.x);
    let c0 = soft_max_mask_row(w.row);
    let slope = alibi_slope(w.row.z);
    var m = -3.4028235e38;
    if (w.live) {
        for (var k = li; k < p.a_ne.x; k += ROW_WG) {
            m = max(m, soft_max_input(w.a0, c0, k, slope));
        }
    }
    m = workgroup_reduce(li, m, true);
    var sum = 0.0;
    if (w.live) {
        for (var k = li; k < p.a_ne.x; k += ROW_WG) {
            let e = exp(soft_max_input(w.a0, c0, k, slope) - m);
            sum += e;
            dset(w.d0 + k * p.d_nb.x, e);
        }
    }
    let inv = 1.0 / workgroup_reduce(li, sum, false);
    if (w.live) {
        // Each invocation rescales the elements it wrote itself: no barrier needed.
        for (var k = li; k < p.a_ne.x; k += ROW_WG) {
            let i = w.d0 + k * p.d_nb.x;
            dset(i, bitcast<f32>(D[i]) * inv);
        }
    }
}

// FLASH_ATTN_EXT in the fast arithmetic: one workgroup of ROW_WG per query row and split of
// the keys (query i of head h, batch i3: row r = i + n_q (h + n_head i3); workgroup
// w = r splits + s takes split s of the keys), over its keys in tiles of ROW_WG with an online
// soft max (ggml's FA arithmetic in f32, in whatever order the tile gives). Bindings: A the
// f32 queries [dk, n_q, n_head, ne3] (element strides a_nb); B the f16 keys [dk, n_kv, heads,
// ne3] (byte strides b_nb, at off.y) and the f16 values in the same buffer (at misc.w, byte
// strides c_ne.x, c_ne.y, misc.z for dims 1..3, misc.y heads); C the f16 mask [n_kv, rows,
// m2, m3] (byte strides c_nb, m2 and m3 in c_ne.z, c_ne.w; f.y = 1 when there is one). f.x is
// the scale, f.z the splits, f.w the keys per split (a multiple of ROW_WG). With one split D
// is the result [dv, n_head, n_q, ne3]; with more, D is scratch where each (row, split) leaves
// its unnormalized sums, maximum and total at (r splits + s) (dv + 2), for
// `flash_attn_merge`. Invocation t scores key j0 + t of each tile; for the values, invocation
// t adds the dims 2 (t % (dv / 2)) and 2 (t % (dv / 2)) + 1 over the tile's keys t / (dv / 2),
// + ROW_WG / (dv / 2), ... (dv a power of two up to 512; the host checks), and the parts are
// added at the end.
var<workgroup> fa_q: array<f32, 512>;
var<workgroup> fa_p: array<f32, 256>;
var<workgroup> fa_out: array<vec2<f32>, 256>;

// A query row's (query, head, batch) and whether it exists (padding workgroups repeat the last).
struct FaRow {
    live: bool,
    r: u32,
    i: u32,
    h: u32,
    i3: u32,
}

fn fa_row(r: u32) -> FaRow {
    let n_q = p.a_ne.y;
    let rows = n_q * p.a_ne.z * p.a_ne.w;
    let rr = min(r, rows - 1u);
    return FaRow(r < rows, rr, rr % n_q, (rr / n_q) % p.a_ne.z, rr / (n_q * p.a_ne.z));
}

@compute @workgroup_size(256)
fn flash_attn_fast(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let splits = u32(p.f.z);
    let row = fa_row(w / splits);
    let split = w % splits;
    let i = row.i;
    let h = row.h;
    let i3 = row.i3;
    let n_head = p.a_ne.z;
    let dk = p.a_ne.x;
    let dv = p.d_ne.x;
    let q0 = p.off.x + i * p.a_nb.y + h * p.a_nb.z + i3 * p.a_nb.w;
    for (var d = li; d < dk; d += ROW_WG) {
        fa_q[d] = af(q0 + d * p.a_nb.x) * p.f.x;
    }
    let k0 = p.off.y + (h / (n_head / p.b_ne.z)) * p.b_nb.z + i3 * p.b_nb.w;
    let v0 = p.misc.w + (h / (n_head / p.misc.y)) * p.c_ne.y + i3 * p.misc.z;
    let m0 = p.off.z + i * p.c_nb.y + (h % p.c_ne.z) * p.c_nb.z + (i3 % p.c_ne.w) * p.c_nb.w;
    let pairs = dv / 2u;
    let pair = li % pairs;
    let part = li / pairs;
    let parts = ROW_WG / pairs;
    let first = split * u32(p.f.w);
    let end = min(p.b_ne.y, first + u32(p.f.w));
    var m = -3.4028235e38;
    var l = 0.0;
    var acc = vec2<f32>(0.0);
    workgroupBarrier();
    for (var j0 = first; j0 < end; j0 += ROW_WG) {
        let j = j0 + li;
        var s = -3.4028235e38;
        if (j < end) {
            let kj = k0 + j * p.b_nb.y;
            var dot_qk = 0.0;
            for (var d = 0u; d < dk; d += 2u) {
                let kv = unpack2x16float(B[(kj + 2u * d) >> 2u]);
                dot_qk = fma(fa_q[d], kv.x, fma(fa_q[d + 1u], kv.y, dot_qk));
            }
            s = dot_qk;
            if (p.f.y != 0.0) {
                s += c_f16(m0 + 2u * j);
            }
        }
        let m_new = max(m, workgroup_reduce(li, s, true));
        // A key masked to -inf (or past the end) weighs 0; a row masked whole keeps m at the
        // lowest float, so no inf - inf.
        let e = select(exp(s - m_new), 0.0, s <= -3.4028235e38);
        fa_p[li] = e;
        let tile_sum = workgroup_reduce(li, e, false);
        let keep = exp(m - m_new);
        l = l * keep + tile_sum;
        acc *= keep;
        m = m_new;
        let keys = min(ROW_WG, end - j0);
        for (var t = part; t < keys; t += parts) {
            let vj = v0 + (j0 + t) * p.c_ne.x;
            acc += fa_p[t] * unpack2x16float(B[(vj + 4u * pair) >> 2u]);
        }
        workgroupBarrier();
    }
    fa_out[li] = acc;
    workgroupBarrier();
    if (!row.live || part != 0u) {
        return;
    }
    var total = vec2<f32>(0.0);
    for (var q = 0u; q < parts; q++) {
        total += fa_out[q * pairs + pair];
    }
    if (splits > 1u) {
        let at = (row.r * splits + split) * (dv + 2u);
        dset(at + 2u * pair, total.x);
        dset(at + 2u * pair + 1u, total.y);
        if (pair == 0u) {
            dset(at + dv, m);
            dset(at + dv + 1u, l);
        }
        return;
    }
    // ggml writes 0 for a row whose every key is masked.
    let inv = select(1.0 / l, 0.0, l == 0.0);
    let o = p.off.w + 2u * pair * p.d_nb.x + h * p.d_nb.y + i * p.d_nb.z + i3 * p.d_nb.w;
    dset(o, total.x * inv);
    dset(o + p.d_nb.x, total.y * inv);
}

// The splits of `flash_attn_fast` added: one workgroup of ROW_WG per query row; A is the
// scratch the splits left (see there), f.z the splits, a_ne the queries' shape, D the result.
@compute @workgroup_size(256)
fn flash_attn_merge(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = fa_row(wid.x + wid.y * nwg.x);
    if (!row.live) {
        return;
    }
    let splits = u32(p.f.z);
    let dv = p.d_ne.x;
    let base = row.r * splits * (dv + 2u);
    var m = -3.4028235e38;
    for (var s = 0u; s < splits; s++) {
        m = max(m, af(base + s * (dv + 2u) + dv));
    }
    var l = 0.0;
    for (var s = 0u; s < splits; s++) {
        let at = base + s * (dv + 2u);
        l += exp(af(at + dv) - m) * af(at + dv + 1u);
    }
    let inv = select(1.0 / l, 0.0, l == 0.0);
    let o = p.off.w + row.h * p.d_nb.y + row.i * p.d_nb.z + row.i3 * p.d_nb.w;
    for (var d = li; d < dv; d += ROW_WG) {
        var total = 0.0;
        for (var s = 0u; s < splits; s++) {
            let at = base + s * (dv + 2u);
            total += exp(af(at + dv) - m) * af(at + d);
        }
        dset(o + d * p.d_nb.x, total * inv);
    }
}

// The activations of a DP4A mat-vec (`mul_mv_blocks` with DP4A): each 32-element block of B's
// rows (f32, any strides; blocks of rows in order) as 12 words of D: the scale amax / 127 (f32)
// at word 0, words 1..4 zero (so the quants start on a 16-byte boundary), then the 32 quants
// round(x / scale) as signed bytes. One invocation per block.
@compute @workgroup_size(64)
fn quantize_q8_fast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let b0 = b_block(i);
    var amax = 0.0;
    for (var k = 0u; k < 32u; k++) {
        amax = max(amax, abs(bf(b0 + k * p.b_nb.x)));
    }
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let o = i * 12u;
    D[o] = bitcast<u32>(amax / 127.0);
    D[o + 1u] = 0u;
    D[o + 2u] = 0u;
    D[o + 3u] = 0u;
    for (var w = 0u; w < 8u; w++) {
        let x = vec4<f32>(bf(b0 + (4u * w) * p.b_nb.x), bf(b0 + (4u * w + 1u) * p.b_nb.x),
                          bf(b0 + (4u * w + 2u) * p.b_nb.x), bf(b0 + (4u * w + 3u) * p.b_nb.x));
        D[o + 4u + w] = pack4xI8(vec4<i32>(round(x * inv)));
    }
}

// SSM_CONV: D[c, t, s] = the dot of channel c's window A[t .. t + d_conv, c, s] with its
// kernel B[0 .. d_conv, c], one invocation per output, native FMAs in tap order.
@compute @workgroup_size(64)
fn ssm_conv_fast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x0 = p.off.x + idx.y * p.a_nb.x + idx.x * p.a_nb.y + idx.z * p.a_nb.z;
    let w0 = p.off.y + idx.x * p.b_nb.y;
    var sum = 0.0;
    for (var k = 0u; k < p.b_ne.x; k++) {
        sum = fma(af(x0 + k * p.a_nb.x), bf(w0 + k * p.b_nb.x), sum);
    }
    dset(p.off.w + at(idx, p.d_nb), sum);
}

fn dget(i: u32) -> f32 { return bitcast<f32>(D[i]); }

// GATED_DELTA_NET: invocation i owns row j of one (head, seq)'s transposed state S (column j
// of ggml's S), kept in slot 0 of the result, where `ops.rs` copied the state source first.
// Per token: the row decays by exp(g) (one gate, or one per column), delta = (v[j] - row . k)
// * beta, row += k * delta, and output j is (row . q) / sqrt(S_v). No row is read by another
// invocation, so the tokens run in order with no barrier.
//
// A: the scratch copy of q (dense [S_v, H_k, T, B_k] from word 0), of g (dense, from word
// a_nb.y; a_nb.x values per row) and of beta (dense, from word a_nb.z); B: k (any strides);
// C: v ([S_v, H, T, B], any strides); D: the result (outputs, then a_nb.w snapshots; slot i
// holds the state i tokens before the last, zeros from slot T on); f.x: 1 / sqrt(S_v).
@compute @workgroup_size(64)
fn gated_delta_net_fast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let n = p.c_ne.x;
    let h = p.c_ne.y;
    let nt = p.c_ne.z;
    let ns = p.c_ne.w;
    let j = i % n;
    let head = (i / n) % h;
    let seq = i / (n * h);
    // q and k heads and sequences broadcast as ggml's: head % H_k, seq / (n_seqs / B_k).
    let hk = head % p.a_ne.y;
    let sk = seq / max(ns / p.a_ne.w, 1u);
    let slot_words = n * n * h * ns;
    let row = p.off.w + n * h * nt * ns + (seq * h + head) * n * n + j * n;
    let g_len = p.a_nb.x;
    for (var t = 0u; t < nt; t++) {
        let at_t = (seq * nt + t) * h + head;
        let q0 = ((sk * nt + t) * p.a_ne.y + hk) * n;
        let k0 = p.off.y + hk * p.b_nb.y + t * p.b_nb.z + sk * p.b_nb.w;
        let g0 = p.a_nb.y + at_t * g_len;
        let beta = af(p.a_nb.z + at_t);
        let vj = cf(p.off.z + j * p.c_nb.x + head * p.c_nb.y + t * p.c_nb.z + seq * p.c_nb.w);
        let decay = exp(af(g0));
        var kv = 0.0;
        for (var e = 0u; e < n; e++) {
            var x = dget(row + e);
            if (g_len > 1u) {
                x = x * exp(af(g0 + e));
            } else {
                x = x * decay;
            }
            dset(row + e, x);
            kv = fma(x, bf(k0 + e * p.b_nb.x), kv);
        }
        let delta = (vj - kv) * beta;
        var o = 0.0;
        for (var e = 0u; e < n; e++) {
            let x = fma(bf(k0 + e * p.b_nb.x), delta, dget(row + e));
            dset(row + e, x);
            o = fma(x, af(q0 + e), o);
        }
        dset(p.off.w + at_t * n + j, o * p.f.x);
        let slot = nt - 1u - t;
        if (slot > 0u && slot < p.a_nb.w) {
            for (var e = 0u; e < n; e++) {
                D[row + slot * slot_words + e] = D[row + e];
            }
        }
    }
    for (var slot = max(nt, 1u); slot < p.a_nb.w; slot++) {
        for (var e = 0u; e < n; e++) {
            D[row + slot * slot_words + e] = 0u;
        }
    }
}

// TANH (misc.y 0), NEG (1), SIGMOID (2), EXP (3) and SOFTPLUS (4, `x` above 20 as ggml has
// it) with the device's own exp, log and tanh: one invocation per element.
@compute @workgroup_size(64)
fn unary_fast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    var y: f32;
    switch p.misc.y {
        case 0u: { y = tanh(x); }
        case 1u: { y = -x; }
        case 2u: { y = 1.0 / (1.0 + exp(-x)); }
        case 3u: { y = exp(x); }
        default: { y = select(log(1.0 + exp(x)), x, x > 20.0); }
    }
    dset(p.off.w + at(idx, p.d_nb), y);
}
