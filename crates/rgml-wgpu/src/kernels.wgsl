// Kernels writing D as plain 4-byte words (f32 / i32 results). Prefixed with `common.wgsl`.

@group(0) @binding(4) var<storage, read_write> D: array<u32>;

fn df(i: u32) -> f32 { return bitcast<f32>(D[i]); }
fn dset(i: u32, v: f32) { D[i] = bitcast<u32>(v); }

// ADD / SUB / MUL / DIV with src1 broadcast (misc.y: 0 add, 1 sub, 2 mul, 3 div).
@compute @workgroup_size(64)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    let y = bf(p.off.y + at(idx % p.b_ne, p.b_nb));
    var r: f32;
    switch p.misc.y {
        case 0u: { r = x + y; }
        case 1u: { r = x - y; }
        case 2u: { r = x * y; }
        default: { r = x / y; }
    }
    dset(p.off.w + at(idx, p.d_nb), r);
}

// SCALE: x * f.x + f.y.
@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    dset(p.off.w + at(idx, p.d_nb), af(p.off.x + at(idx, p.a_nb)) * p.f.x + p.f.y);
}

// CLAMP: ggml's MAX(MIN(x, f.y), f.x), comparisons as the C macros make them (a NaN becomes f.y).
@compute @workgroup_size(64)
fn clamp_op(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    let below_max = select(p.f.y, x, x < p.f.y);
    dset(p.off.w + at(idx, p.d_nb), select(p.f.x, below_max, below_max > p.f.x));
}

// ADD_ID: gpt-oss's expert biases, A [n, n_used, n_tokens] plus row ids[e, t] of B (C: I32
// [n_used, n_tokens]). An index outside B gives NaN, never a read elsewhere.
@compute @workgroup_size(64)
fn add_id(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let row = bitcast<i32>(C[p.off.z + idx.y * p.c_nb.x + idx.z * p.c_nb.y]);
    var v = bitcast<f32>(0x7fc00000u);
    if (row >= 0 && u32(row) < p.b_ne.y) {
        v = af(p.off.x + at(idx, p.a_nb)) + bf(p.off.y + idx.x * p.b_nb.x + u32(row) * p.b_nb.y);
    }
    dset(p.off.w + at(idx, p.d_nb), v);
}

// SILU: x * sigmoid(x).
@compute @workgroup_size(64)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    dset(p.off.w + at(idx, p.d_nb), silu_at(x, idx.x, p.d_ne.x));
}

// CPY / CONT / DUP to f32: element i of A (in A's shape, type misc.z: f32 or f16) to element i
// of D (in D's shape).
@compute @workgroup_size(64)
fn cpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let v = a_elem(p.misc.z, p.off.x + at(unravel(i, p.a_ne), p.a_nb), 0u, 0u);
    dset(p.off.w + at(unravel(i, p.d_ne), p.d_nb), v);
}

// GET_ROWS: D[i0, i1, i2, i3] = A[i0, B[i1, i2, i3], i2, i3] (B holds i32 indices; A of type
// misc.z).
@compute @workgroup_size(64)
fn get_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let row = bitcast<i32>(B[p.off.y + idx.y * p.b_nb.x + idx.z * p.b_nb.y + idx.w * p.b_nb.z]);
    var v = 0.0;
    if (row >= 0 && u32(row) < p.a_ne.y) {
        let base = p.off.x + u32(row) * p.a_nb.y + idx.z * p.a_nb.z + idx.w * p.a_nb.w;
        v = a_elem(p.misc.z, base, idx.x, p.a_nb.x);
    }
    dset(p.off.w + at(idx, p.d_nb), v);
}

// RMS_NORM, one invocation per row: x / sqrt(mean(x^2) + f.x).
@compute @workgroup_size(64)
fn rms_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    var sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        let x = af(a0 + k * p.a_nb.x);
        sum += x * x;
    }
    let s = div_rn(1.0, sqrt_rn(sum / f32(p.a_ne.x) + p.f.x));
    for (var k = 0u; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, af(a0 + k * p.a_nb.x) * s);
    }
}

// SOFT_MAX, one invocation per row, of x * f.x (+ slope * mask C when misc.y == 1, of type
// misc.z: f32 or f16, rows by i1, broadcast over dims 2 and 3). ALiBi slope of head i2:
// f.y^(i2 + 1) below misc.w heads, f.z^(2 (i2 - misc.w) + 1) from there (1 without ALiBi).
@compute @workgroup_size(64)
fn soft_max(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let c0 = soft_max_mask_row(row);
    let slope = alibi_slope(row.z);
    var m = -3.4028235e38;
    for (var k = 0u; k < p.a_ne.x; k++) {
        m = max(m, soft_max_input(a0, c0, k, slope));
    }
    var sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        let e = exp(soft_max_input(a0, c0, k, slope) - m);
        sum += e;
        dset(d0 + k * p.d_nb.x, e);
    }
    let inv = 1.0 / sum;
    for (var k = 0u; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, df(d0 + k * p.d_nb.x) * inv);
    }
}

// One step of a tinyBLAS lane of MUL_MAT: acc + A[k] * B[k] with one rounding, A of type `t` at
// row `a0`, B the f32 row at `b0`. Against f16 weights B is rounded to f16 first, as ggml
// converts it; f16 x f16 products are exact in f32, so a plain add rounds once too.
fn mm_step(t: u32, a0: u32, b0: u32, k: u32, acc: f32) -> f32 {
    let b = bf(b0 + k * p.b_nb.x);
    if (t == T_F32) {
        return fma_x(af(a0 + k * p.a_nb.x), b, acc);
    }
    if (t == T_F16) {
        return acc + a_f16(a0 + k * p.a_nb.x) * round_f16(b);
    }
    return fma_x(a_elem(t, a0, k, p.a_nb.x), b, acc);
}

// MUL_MAT with f32 or f16 weights: D[i0, i1, i2, i3] = sum_k A[k, i0, i2 / misc.y, i3 / misc.z] *
// B[k, i1, i2, i3], A of type misc.w (f32, f16, or a quantized type dequantized here when
// misc.w is not one of those), B f32. f32 / f16 dots follow ggml-cpu's (tinyBLAS's) AVX-512
// order: 16 fused multiply-add lanes (element k in lane k % 16), then `_mm512_reduce_add_ps`;
// against f16 weights B is first rounded to f16, as ggml converts it to the weights' type.
@compute @workgroup_size(64)
fn mul_mat(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let a0 = p.off.x + idx.x * p.a_nb.y + (idx.z / p.misc.y) * p.a_nb.z + (idx.w / p.misc.z) * p.a_nb.w;
    let b0 = p.off.y + idx.y * p.b_nb.y + idx.z * p.b_nb.z + idx.w * p.b_nb.w;
    let t = p.misc.w;
    let n = p.a_ne.x;
    var acc: array<f32, 16>;
    for (var k = 0u; k < n; k++) {
        let l = k % 16u;
        acc[l] = mm_step(t, a0, b0, k, acc[l]);
    }
    dset(p.off.w + at(idx, p.d_nb), hsum16(acc));
}

// Quantize the rows of B (f32, any strides) to ggml-cpu's run-time Q8 activations, one
// invocation per 32-element block, into D (the scratch buffer, Q8_WORDS words per block, blocks
// of B's rows in order). As ggml's x86 `quantize_row_q8_0` / `q8_1`: amax of the block, scale
// amax / 127 (stored rounded to f16), quants round_half_even(x * (127 / amax)), and the sum
// term f16(scale * sum(q)) that Q4_1 weights need.
@compute @workgroup_size(64)
fn quantize_q8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let b0 = b_block(i);
    var x: array<f32, 32>;
    var amax = 0.0;
    for (var k = 0u; k < 32u; k++) {
        x[k] = bf(b0 + k * p.b_nb.x);
        amax = max(amax, abs(x[k]));
    }
    var d = 0.0;
    var id = 0.0;
    if (amax != 0.0) {
        d = div_rn(amax, 127.0);
        id = div_rn(127.0, amax);
    }
    let o = p.off.w + i * Q8_WORDS;
    var sum = 0;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = i32(round(x[4u * w + k] * id));
            sum += q;
            word |= (bitcast<u32>(q) & 0xffu) << (8u * k);
        }
        D[o + 2u + w] = word;
    }
    D[o] = bitcast<u32>(round_f16(d));
    D[o + 1u] = bitcast<u32>(round_f16(d * f32(sum)));
}

// Bytes per block of Q4_0, Q4_1 or Q8_0 weights.
fn q8_dot_block_bytes(t: u32) -> u32 {
    switch t {
        case T_Q4_0: { return 18u; }
        case T_Q4_1: { return 20u; }
        default: { return 34u; }
    }
}

// Lane `l` of ggml-cpu's x86 dot product of block `blk` of the weight row at byte `a0` (type
// `t`) with the quantized activations at word `yb` of C: the exact integer sum over elements
// 4l..4l+3.
fn q8_lane_sum(t: u32, a0: u32, blk: u32, yb: u32, l: u32) -> i32 {
    let xb = a0 + blk * q8_dot_block_bytes(t);
    let yw = C[yb + 2u + l];
    var s = 0;
    if (t == T_Q8_0) {
        let xw = a_u32(xb + 2u + 4u * l);
        for (var e = 0u; e < 4u; e++) {
            s += i8_of(xw, e) * i8_of(yw, e);
        }
        return s;
    }
    let qo = select(2u, 4u, t == T_Q4_1);
    let off = select(8, 0, t == T_Q4_1);
    let xw = a_u32(xb + qo + 4u * (l % 4u));
    let sh = select(0u, 4u, l >= 4u);
    for (var e = 0u; e < 4u; e++) {
        s += (i32((xw >> (8u * e + sh)) & 0xfu) - off) * i8_of(yw, e);
    }
    return s;
}

// The weight row at byte `a0` and the quantized activation row at word `c0` of C for output
// `idx` of a MUL_MAT of Q8-dotted weights.
fn q8_rows(idx: vec4<u32>) -> vec2<u32> {
    let a0 = p.off.x + idx.x * p.a_nb.y + (idx.z / p.misc.y) * p.a_nb.z + (idx.w / p.misc.z) * p.a_nb.w;
    let r1 = idx.y + p.b_ne.y * (idx.z + p.b_ne.z * idx.w);
    return vec2<u32>(a0, p.off.z + r1 * (p.a_ne.x / 32u) * Q8_WORDS);
}

// MUL_MAT of Q4_0, Q4_1 or Q8_0 weights (misc.w) by activations quantized by `quantize_q8`
// (C, rows of B in order): ggml-cpu's x86 dot products exactly. Per block, 8 lanes of 4
// elements each get their exact integer sum, and each lane accumulates fma(d_x * d_y, sum,
// acc) over the blocks; Q4_1 adds its min term sum(m_x * s_y) after the lanes' `hsum_float_8`.
// One invocation per output (the prompt path; see `mul_mv_q8` for one activation column).
@compute @workgroup_size(64)
fn mul_mat_q8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let rows = q8_rows(idx);
    let t = p.misc.w;
    let bb = q8_dot_block_bytes(t);
    var acc: array<f32, 8>;
    var summs = 0.0;
    for (var blk = 0u; blk < p.a_ne.x / 32u; blk++) {
        let yb = rows.y + blk * Q8_WORDS;
        let xb = rows.x + blk * bb;
        if (t == T_Q4_1) {
            summs += a_f16(xb + 2u) * cf(yb + 1u);
        }
        let d = a_f16(xb) * cf(yb);
        for (var l = 0u; l < 8u; l++) {
            acc[l] = fma_x(d, f32(q8_lane_sum(t, rows.x, blk, yb, l)), acc[l]);
        }
    }
    dset(p.off.w + at(idx, p.d_nb), hsum8(acc) + summs);
}

// Lane accumulators of the matrix-vector kernels, one per invocation.
var<workgroup> lanes: array<f32, 64>;

// The matrix-vector path of `mul_mat_q8` (generation: one activation column): 8 invocations per
// output, invocation l owning SIMD lane l of ggml-cpu's dot product, so the rounding order is
// the same while the row's blocks are read side by side; lane 0 adds the lanes up.
@compute @workgroup_size(64)
fn mul_mv_q8(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let l = li % 8u;
    let out = (wid.x + wid.y * nwg.x) * 8u + li / 8u;
    let valid = out < p.misc.x / 8u;
    var acc = 0.0;
    var summs = 0.0;
    var idx = vec4<u32>(0u);
    if (valid) {
        idx = unravel(out, p.d_ne);
        let rows = q8_rows(idx);
        let t = p.misc.w;
        let bb = q8_dot_block_bytes(t);
        for (var blk = 0u; blk < p.a_ne.x / 32u; blk++) {
            let yb = rows.y + blk * Q8_WORDS;
            let xb = rows.x + blk * bb;
            if (l == 0u && t == T_Q4_1) {
                summs += a_f16(xb + 2u) * cf(yb + 1u);
            }
            let d = a_f16(xb) * cf(yb);
            acc = fma_x(d, f32(q8_lane_sum(t, rows.x, blk, yb, l)), acc);
        }
    }
    lanes[li] = acc;
    workgroupBarrier();
    if (valid && l == 0u) {
        var v: array<f32, 8>;
        for (var k = 0u; k < 8u; k++) {
            v[k] = lanes[li + k];
        }
        dset(p.off.w + at(idx, p.d_nb), hsum8(v) + summs);
    }
}

// The matrix-vector path of `mul_mat` for f32 / f16 weights: 16 invocations per output,
// invocation l owning lane l (elements l, l + 16, ...), then `hsum16` by lane 0. In tinyBLAS's
// order (c_ne.x == 0) a lane has one accumulator; in `ggml_vec_dot_f16` / `_f32`'s (c_ne.x == 1,
// where tinyBLAS declines: one activation row, or rows it cannot tile) four, taking the
// elements of consecutive 64-element steps in turn, folded (0 + 2) + (1 + 3) before the sum.
// (`supports_op` keeps the vec_dot order to rows of whole 64-element steps: ggml sums the
// remainder in f64.)
@compute @workgroup_size(64)
fn mul_mv(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let l = li % 16u;
    let out = (wid.x + wid.y * nwg.x) * 4u + li / 16u;
    let valid = out < p.misc.x / 16u;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var idx = vec4<u32>(0u);
    if (valid) {
        idx = unravel(out, p.d_ne);
        let a0 = p.off.x + idx.x * p.a_nb.y + (idx.z / p.misc.y) * p.a_nb.z + (idx.w / p.misc.z) * p.a_nb.w;
        let b0 = p.off.y + idx.y * p.b_nb.y + idx.z * p.b_nb.z + idx.w * p.b_nb.w;
        let t = p.misc.w;
        let steps = select(1u, 4u, p.c_ne.x == 1u);
        for (var k = l; k < p.a_ne.x; k += 16u) {
            let j = (k / 16u) % steps;
            acc[j] = mm_step(t, a0, b0, k, acc[j]);
        }
    }
    lanes[li] = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    workgroupBarrier();
    if (valid && l == 0u) {
        var v: array<f32, 16>;
        for (var k = 0u; k < 16u; k++) {
            v[k] = lanes[li + k];
        }
        dset(p.off.w + at(idx, p.d_nb), hsum16(v));
    }
}

// GELU as ggml-cpu computes it (`GGML_GELU_FP16`): 0 at or below -10, x at or above 10,
// elsewhere the entry of x rounded to f16 in ggml's table, bound as C (65536 f32 values indexed
// by the f16 bits, see `rgml::tables`).
fn gelu_of(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    return cf(f16_bits(x));
}

@compute @workgroup_size(64)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    dset(p.off.w + at(idx, p.d_nb), gelu_of(x));
}

// SWIGLU (misc.y 0) and GEGLU (misc.y 1): act(A) * B (equal shapes).
@compute @workgroup_size(64)
fn glu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    let y = bf(p.off.y + at(idx, p.b_nb));
    var out: f32;
    if (p.misc.y == 1u) {
        // ggml_vec_geglu_f32: exactly 0 at or below -10 (not 0 * y).
        out = select(gelu_of(x) * y, 0.0, x <= -10.0);
    } else {
        out = silu_at(x, idx.x, p.d_ne.x) * y;
    }
    dset(p.off.w + at(idx, p.d_nb), out);
}

// DIAG_MASK_INF: -inf where i0 > misc.y + i1, else a copy.
@compute @workgroup_size(64)
fn diag_mask_inf(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let d = p.off.w + at(idx, p.d_nb);
    if (idx.x > p.misc.y + idx.y) {
        D[d] = 0xff800000u;
    } else {
        D[d] = A[p.off.x + at(idx, p.a_nb)];
    }
}

// NORM, one invocation per row: (x - mean) / sqrt(var + f.x).
@compute @workgroup_size(64)
fn norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let n = f32(p.a_ne.x);
    var sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        sum += af(a0 + k * p.a_nb.x);
    }
    let mean = sum / n;
    var var_sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        let v = af(a0 + k * p.a_nb.x) - mean;
        var_sum += v * v;
    }
    let s = 1.0 / sqrt(var_sum / n + p.f.x);
    for (var k = 0u; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, (af(a0 + k * p.a_nb.x) - mean) * s);
    }
}

// ROPE's cos / sin table where the device has no f64 (`rope_cache_f64` elsewhere): one
// invocation per (position, pair), writing (cos θ · mscale, sin θ · mscale) at D[2 i] with the
// device's `cos` / `sin` (a few ulp from libm's: close to the CPU, not bit-equal). misc.y:
// n_dims (even); misc.z: 1 with frequency factors in C; see `rope_theta` for the rest.
@compute @workgroup_size(64)
fn rope_cache(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let pairs = p.misc.y / 2u;
    let theta = rope_theta(i / pairs, i % pairs);
    dset(p.off.w + 2u * i, cos(theta) * p.f.w);
    dset(p.off.w + 2u * i + 1u, sin(theta) * p.f.w);
}

// ROPE, one invocation per pair of elements of a row (i1, i2, i3) of A, with the (cos, sin) pairs of position i2 from
// the table in C (`rope_cache`, n_dims floats per position). misc.y: n_dims (even); misc.z: 0
// normal (adjacent pairs), 1 NeoX (halves); misc.w: how many leading pairs rotate with fused
// multiply-adds (the rest with every product rounded, as ggml's vectorized normal-mode loop
// leaves them). Dimensions from n_dims on are copied. misc.x: rows x ceil(ne0 / 2) invocations.
@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // One invocation per pair of elements (2q, 2q + 1) of a row: a row's pairs are independent,
    // and a loop over them would wait for each load in turn.
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let half = (p.a_ne.x + 1u) / 2u;
    let q = r % half;
    let row = unravel_row(r / half, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let n_dims = p.misc.y;
    let i0 = 2u * q;
    if (i0 >= n_dims) {
        for (var k = i0; k < min(i0 + 2u, p.a_ne.x); k++) {
            dset(d0 + k * p.d_nb.x, af(a0 + k * p.a_nb.x));
        }
        return;
    }
    let t0 = p.off.z + row.z * n_dims;
    let c = cf(t0 + i0);
    let s = cf(t0 + i0 + 1u);
    var ia = i0;
    var ib = i0 + 1u;
    if (p.misc.z == 1u) {
        ia = i0 / 2u;
        ib = i0 / 2u + n_dims / 2u;
    }
    let x0 = af(a0 + ia * p.a_nb.x);
    let x1 = af(a0 + ib * p.a_nb.x);
    // ggml's `x0*c - x1*s`, `x0*s + x1*c` with the first products fused, as GCC compiles it,
    // except in the pairs its vectorized loop leaves over.
    if (q < p.misc.w) {
        dset(d0 + ia * p.d_nb.x, fma_x(x0, c, -(x1 * s)));
        dset(d0 + ib * p.d_nb.x, fma_x(x0, s, x1 * c));
    } else {
        dset(d0 + ia * p.d_nb.x, x0 * c - x1 * s);
        dset(d0 + ib * p.d_nb.x, x0 * s + x1 * c);
    }
}

// SET_ROWS to f32: row i1 of B (f32) to row C[i1, i2 % k2, i3 % k3] of D. Indices out of range
// write nothing.
@compute @workgroup_size(64)
fn set_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.b_ne);
    let row = set_rows_index(idx);
    if (row < 0 || u32(row) >= p.d_ne.y) {
        return;
    }
    dset(p.off.w + at(vec4<u32>(idx.x, u32(row), idx.z, idx.w), p.d_nb), bf(p.off.y + at(idx, p.b_nb)));
}

// CONCAT along dim misc.y: D[i] = A[i] where i[dim] < A.ne[dim], else B[i - A.ne[dim]].
@compute @workgroup_size(64)
fn concat(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let dim = p.misc.y;
    var v: f32;
    if (idx[dim] < p.a_ne[dim]) {
        v = af(p.off.x + at(idx, p.a_nb));
    } else {
        var j = idx;
        j[dim] = idx[dim] - p.a_ne[dim];
        v = bf(p.off.y + at(j, p.b_nb));
    }
    dset(p.off.w + at(idx, p.d_nb), v);
}

// ARGMAX, one invocation per row: the first index of the row's maximum (i32).
@compute @workgroup_size(64)
fn argmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    var best = 0u;
    var m = af(a0);
    for (var k = 1u; k < p.a_ne.x; k++) {
        let x = af(a0 + k * p.a_nb.x);
        if (x > m) {
            m = x;
            best = k;
        }
    }
    D[p.off.w + r * p.d_nb.x] = best;
}
