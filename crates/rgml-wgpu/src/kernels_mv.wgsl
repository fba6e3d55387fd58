// The fast arithmetic's block mat-vec (`mul_mv_blocks`, see `kernels.rs`): MUL_MAT by a few
// activation columns (generation), for the weight types a decoded model streams most. Prefixed
// with `params.wgsl` and the row-sum flavour (`SUBGROUP_ROWS`, `row_total`); the other fast
// kernels are in `kernels_fast.wgsl`.
//
// A workgroup of 128 invocations is 128 / TEAM teams; each team computes ROWS weight rows for
// NCOLS activation columns. A block of TYPE is split into LANES parts of 8 or 16 elements;
// team invocation i takes part i % LANES of every (TEAM / LANES)-th block from block i / LANES
// on. So a warp reads whole blocks side by side (its loads coalesce), and each invocation
// decodes its part once per row with its activations in registers: the activations are read as
// 16-byte vectors (binding B is `array<vec4<f32>>` here), once per block and column for all
// ROWS rows. A team of 32 is one warp where subgroups are 32 wide (`SUBGROUP_ROWS`): its sums
// need no workgroup memory or barrier, and each invocation takes 4 times the blocks of a team
// of 128 (more loads in flight per invocation, fewer invocations to add up).
//
// The weights are read as 4-byte words: the 4-aligned types' (Q4_1, Q5_1, Q4_K, Q5_K, F32)
// straight, the 2-aligned ones' (Q4_0, Q5_0, Q8_0, Q6_K, F16, BF16) from two words where a
// block starts between words. Sums are f32 FMAs in whatever order (the fast arithmetic).

@group(0) @binding(1) var<storage, read_write> A: array<u32>;
@group(0) @binding(2) var<storage, read_write> B: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> D: array<f32>;

override TYPE: u32 = 0u;
// Activation columns (1..=MV_MAX_COLS) and weight rows (1..=MV_MAX_ROWS) per workgroup.
override NCOLS: u32 = 1u;
override ROWS: u32 = 4u;
// Invocations per team (32 or 128).
override TEAM: u32 = 128u;
// Gate and up projections of one activation with the SwiGLU of the two (see `mv_write`).
override GLU: bool = false;
// Activations quantized to int8 blocks (`quantize_q8_fast`'s layout, bound as B) and dotted
// with DP4A (`dot4I8Packed`): Q4_0, Q8_0, Q4_K and Q6_K only (the host checks).
override DP4A: bool = false;

const MV_WG: u32 = 128u;
const MV_MAX_COLS: u32 = 8u;
const MV_MAX_ROWS: u32 = 4u;

// Elements per block (a float row is taken in blocks of 32) and its bytes (F32: 4-byte words).
fn block_elems() -> u32 {
    switch TYPE {
        case T_Q4_K, T_Q5_K, T_Q6_K: { return 256u; }
        default: { return 32u; }
    }
}

fn block_size() -> u32 {
    switch TYPE {
        case T_Q4_0: { return 18u; }
        case T_Q4_1: { return 20u; }
        case T_Q5_0: { return 22u; }
        case T_Q5_1: { return 24u; }
        case T_Q8_0: { return 34u; }
        case T_Q4_K: { return 144u; }
        case T_Q5_K: { return 176u; }
        case T_Q6_K: { return 210u; }
        case T_F16, T_BF16: { return 64u; }
        default: { return 32u; }
    }
}

// Invocations per block: 16 parts of 16 elements for the K-quants, 4 of 8 for the others.
fn lanes() -> u32 {
    return select(4u, 16u, block_elems() == 256u);
}

// One invocation's part of a block's activations: 4 runs of 4 elements (the last two zero for
// parts of 8).
struct Part {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
}

// Where lane `l`'s 4 runs start in its block (elements), matching `part_dot`'s decoding.
fn part_runs(l: u32) -> vec4<u32> {
    switch TYPE {
        case T_Q4_K, T_Q5_K: {
            // Bytes 8 (l % 4) .. + 8 of the 32-byte run l / 4: low nibbles are elements
            // 64 (l / 4) + 8 (l % 4) + 0..8, high nibbles 32 further.
            let at = 64u * (l / 4u) + 8u * (l % 4u);
            return vec4<u32>(at, at + 4u, at + 32u, at + 36u);
        }
        case T_Q6_K: {
            // Half l / 8, bytes 4 (l % 8) .. + 4 of its low-nibble rows: 4 elements 32 apart.
            let at = 128u * (l / 8u) + 4u * (l % 8u);
            return vec4<u32>(at, at + 32u, at + 64u, at + 96u);
        }
        case T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1: {
            // Quant bytes 4 l .. + 4: low nibbles elements 4 l + 0..4, high ones 16 further.
            return vec4<u32>(4u * l, 4u * l + 16u, 0u, 0u);
        }
        default: {
            return vec4<u32>(8u * l, 8u * l + 4u, 0u, 0u);
        }
    }
}

// Activation row `b0` (4-aligned element), block `blk`'s part at `runs`.
fn load_part(b0: u32, runs: vec4<u32>) -> Part {
    let i = b0 >> 2u;
    let wide = block_elems() == 256u;
    var x = Part(B[i + (runs.x >> 2u)], B[i + (runs.y >> 2u)], vec4<f32>(0.0), vec4<f32>(0.0));
    if (wide) {
        x.v2 = B[i + (runs.z >> 2u)];
        x.v3 = B[i + (runs.w >> 2u)];
    }
    return x;
}

// The 4 bytes of A at 4-aligned byte `b`, and at 2-aligned byte `b` (two words where `b`
// is between words; both are always read, so a warp's lanes never diverge on alignment).
fn w4(b: u32) -> u32 {
    return A[b >> 2u];
}

fn w2(b: u32) -> u32 {
    let lo = A[b >> 2u];
    let hi = A[(b >> 2u) + 1u];
    return select(lo, (lo >> 16u) | (hi << 16u), (b & 2u) != 0u);
}

fn f16_at(b: u32) -> f32 {
    return unpack2x16float(A[b >> 2u] >> ((b & 2u) * 8u)).x;
}

// The four bytes of `w` (each a value 0..255), minus `bias` (`u8x4`: `convert.wgsl`).
fn bytes4(w: u32, bias: f32) -> vec4<f32> {
    return u8x4(w) - vec4<f32>(bias);
}

// The low / high nibbles of `w`'s four bytes, each in its byte.
fn lo_nibbles(w: u32) -> u32 {
    return w & 0x0f0f0f0fu;
}

fn hi_nibbles(w: u32) -> u32 {
    return (w >> 4u) & 0x0f0f0f0fu;
}

// Bit `b` of each byte of `w`, moved to bit 4 of its byte.
fn byte_bit4(w: u32, b: u32) -> u32 {
    return ((w >> b) & 0x01010101u) << 4u;
}

// Bits e..e + 4 of `w`, each to bit 4 of its own byte (Q5_0 / Q5_1's fifth bits).
fn spread_bit4(w: u32, e: u32) -> u32 {
    let v = w >> e;
    return ((v & 1u) | ((v & 2u) << 7u) | ((v & 4u) << 14u) | ((v & 8u) << 21u)) << 4u;
}

fn hsum(v: vec4<f32>) -> f32 {
    return dot(v, vec4<f32>(1.0));
}

// Byte `i` of the 12 scale bytes (s0, s1, s2) of a Q4_K / Q5_K block.
fn sbyte(s0: u32, s1: u32, s2: u32, i: u32) -> u32 {
    let w = select(select(s2, s1, i < 8u), s0, i < 4u);
    return (w >> (8u * (i % 4u))) & 0xffu;
}

// Scale and min of sub-block `j` of a Q4_K / Q5_K block (ggml's get_scale_min_k4).
fn scale_min(s0: u32, s1: u32, s2: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(u1f(sbyte(s0, s1, s2, j) & 63u), u1f(sbyte(s0, s1, s2, j + 4u) & 63u));
    }
    let q = sbyte(s0, s1, s2, j + 4u);
    let sc = (q & 0xfu) | ((sbyte(s0, s1, s2, j - 4u) >> 6u) << 4u);
    let mn = (q >> 4u) | ((sbyte(s0, s1, s2, j) >> 6u) << 4u);
    return vec2<f32>(u1f(sc), u1f(mn));
}

// The scales of sub-blocks 2 im (`lo`) and 2 im + 1 (`hi`) of the Q4_K / Q5_K block at byte
// `blk`, each (d times its scale, dmin times its min).
struct K4Scales {
    lo: vec2<f32>,
    hi: vec2<f32>,
}

fn k4_scales(blk: u32, im: u32) -> K4Scales {
    let dm = unpack2x16float(w4(blk));
    let s0 = w4(blk + 4u);
    let s1 = w4(blk + 8u);
    let s2 = w4(blk + 12u);
    return K4Scales(scale_min(s0, s1, s2, 2u * im) * dm, scale_min(s0, s1, s2, 2u * im + 1u) * dm);
}

// Lane `l`'s part of the Q6_K block at byte `blk`: its four runs of 4 six-bit quants (0..63,
// one per byte; runs 32 elements apart, see `part_runs`) and each run's signed scale.
struct Q6Part {
    q: vec4<u32>,
    sc: vec4<f32>,
}

fn q6k_part(blk: u32, l: u32) -> Q6Part {
    let h = l / 8u;
    let q = 4u * (l % 8u);
    let ql0 = w2(blk + 64u * h + q);
    let ql1 = w2(blk + 64u * h + 32u + q);
    let qh = w2(blk + 128u + 32u * h + q);
    // Scales 8 h + q / 16 + 2 r (signed bytes, read as unsigned ones plus 128).
    let su = vec2<u32>(w2(blk + 192u + 8u * h), w2(blk + 196u + 8u * h)) ^ vec2<u32>(0x80808080u);
    let sh = 8u * (q / 16u);
    let sc = vec4<f32>(
        u1f((su.x >> sh) & 0xffu), u1f((su.x >> (sh + 16u)) & 0xffu),
        u1f((su.y >> sh) & 0xffu), u1f((su.y >> (sh + 16u)) & 0xffu)) - 128.0;
    let quants = vec4<u32>(
        lo_nibbles(ql0) | (((qh >> 0u) & 0x03030303u) << 4u),
        lo_nibbles(ql1) | (((qh >> 2u) & 0x03030303u) << 4u),
        hi_nibbles(ql0) | (((qh >> 4u) & 0x03030303u) << 4u),
        hi_nibbles(ql1) | (((qh >> 6u) & 0x03030303u) << 4u));
    return Q6Part(quants, sc);
}

// Lane `l`'s part of the block at byte `blk` (element for F32) dotted with its activations.
fn part_dot(blk: u32, l: u32, x: Part) -> f32 {
    switch TYPE {
        case T_Q4_K, T_Q5_K: {
            let im = l / 4u;
            let l0 = 8u * (l % 4u);
            let k4 = k4_scales(blk, im);
            let q5 = TYPE == T_Q5_K;
            let qs = blk + select(16u, 48u, q5) + 32u * im + l0;
            let q0 = w4(qs);
            let q1 = w4(qs + 4u);
            var n = vec4<u32>(lo_nibbles(q0), lo_nibbles(q1), hi_nibbles(q0), hi_nibbles(q1));
            if (q5) {
                // The fifth bits: bit 2 im (low nibbles) and 2 im + 1 (high) of bytes l0.. of qh.
                let h0 = w4(blk + 16u + l0);
                let h1 = w4(blk + 20u + l0);
                n |= vec4<u32>(byte_bit4(h0, 2u * im), byte_bit4(h1, 2u * im),
                               byte_bit4(h0, 2u * im + 1u), byte_bit4(h1, 2u * im + 1u));
            }
            let a0 = bytes4(n.x, 0.0);
            let a1 = bytes4(n.y, 0.0);
            let b0 = bytes4(n.z, 0.0);
            let b1 = bytes4(n.w, 0.0);
            let dot_lo = dot(a0, x.v0) + dot(a1, x.v1);
            let dot_hi = dot(b0, x.v2) + dot(b1, x.v3);
            let sum_lo = hsum(x.v0 + x.v1);
            let sum_hi = hsum(x.v2 + x.v3);
            return k4.lo.x * dot_lo - k4.lo.y * sum_lo + k4.hi.x * dot_hi - k4.hi.y * sum_hi;
        }
        case T_Q6_K: {
            let q6 = q6k_part(blk, l);
            let c0 = bytes4(q6.q.x, 32.0);
            let c1 = bytes4(q6.q.y, 32.0);
            let c2 = bytes4(q6.q.z, 32.0);
            let c3 = bytes4(q6.q.w, 32.0);
            let dots = vec4<f32>(dot(c0, x.v0), dot(c1, x.v1), dot(c2, x.v2), dot(c3, x.v3));
            return f16_at(blk + 208u) * dot(q6.sc, dots);
        }
        case T_Q8_0: {
            let d = f16_at(blk);
            let qs = blk + 2u + 8u * l;
            // Signed bytes as unsigned ones plus 128.
            let q = vec2<u32>(w2(qs), w2(qs + 4u)) ^ vec2<u32>(0x80808080u);
            return d * (dot(bytes4(q.x, 128.0), x.v0) + dot(bytes4(q.y, 128.0), x.v1));
        }
        case T_Q4_0: {
            let d = f16_at(blk);
            let w = w2(blk + 2u + 4u * l);
            return d * (dot(bytes4(lo_nibbles(w), 8.0), x.v0) + dot(bytes4(hi_nibbles(w), 8.0), x.v1));
        }
        case T_Q4_1: {
            let dm = unpack2x16float(w4(blk));
            let w = w4(blk + 4u + 4u * l);
            let dots = dot(bytes4(lo_nibbles(w), 0.0), x.v0) + dot(bytes4(hi_nibbles(w), 0.0), x.v1);
            return dm.x * dots + dm.y * hsum(x.v0 + x.v1);
        }
        case T_Q5_0: {
            let d = f16_at(blk);
            let qh = w2(blk + 2u);
            let w = w2(blk + 6u + 4u * l);
            let a = bytes4(lo_nibbles(w) | spread_bit4(qh, 4u * l), 16.0);
            let b = bytes4(hi_nibbles(w) | spread_bit4(qh, 4u * l + 16u), 16.0);
            return d * (dot(a, x.v0) + dot(b, x.v1));
        }
        case T_Q5_1: {
            let dm = unpack2x16float(w4(blk));
            let qh = w4(blk + 4u);
            let w = w4(blk + 8u + 4u * l);
            let a = bytes4(lo_nibbles(w) | spread_bit4(qh, 4u * l), 0.0);
            let b = bytes4(hi_nibbles(w) | spread_bit4(qh, 4u * l + 16u), 0.0);
            return dm.x * (dot(a, x.v0) + dot(b, x.v1)) + dm.y * hsum(x.v0 + x.v1);
        }
        case T_F16, T_BF16: {
            let at = blk + 16u * l;
            let w = vec4<u32>(w2(at), w2(at + 4u), w2(at + 8u), w2(at + 12u));
            if (TYPE == T_F16) {
                let a = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
                let b = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
                return dot(a, x.v0) + dot(b, x.v1);
            }
            let lo = w << vec4<u32>(16u);
            let hi = w & vec4<u32>(0xffff0000u);
            let a = bitcast<vec4<f32>>(vec4<u32>(lo.x, hi.x, lo.y, hi.y));
            let b = bitcast<vec4<f32>>(vec4<u32>(lo.z, hi.z, lo.w, hi.w));
            return dot(a, x.v0) + dot(b, x.v1);
        }
        default: {
            // F32: `blk` is a 4-byte element index.
            let at = blk + 8u * l;
            let a = bitcast<vec4<f32>>(vec4<u32>(A[at], A[at + 1u], A[at + 2u], A[at + 3u]));
            let b = bitcast<vec4<f32>>(vec4<u32>(A[at + 4u], A[at + 5u], A[at + 6u], A[at + 7u]));
            return dot(a, x.v0) + dot(b, x.v1);
        }
    }
}

// One invocation's part of a block's activations in DP4A mode: four words of signed bytes and
// the scale of the 32-element block each comes from (see `q8_part`).
struct Q8Part {
    w: vec4<u32>,
    d: vec4<f32>,
}

// Word `w` (0..8) of quantized activation block `b`, and its scale (`quantize_q8_fast`: 12
// words, i.e. 3 vec4 of B, per block).
fn q8_word(b: u32, w: u32) -> u32 {
    return bitcast<u32>(B[3u * b + 1u + w / 4u][w % 4u]);
}

fn q8_scale(b: u32) -> f32 {
    return B[3u * b].x;
}

// Lane `l`'s activations of weight block `blk` of the column whose first activation block is
// `c0`, matching `part_dot_q8`.
fn q8_part(c0: u32, blk: u32, l: u32) -> Q8Part {
    switch TYPE {
        case T_Q4_K: {
            // Elements 64 im + l0 .. + 8 (block 2 im of the 8) and 32 further (block 2 im + 1).
            let b = c0 + 8u * blk + 2u * (l / 4u);
            let w = 2u * (l % 4u);
            return Q8Part(vec4<u32>(q8_word(b, w), q8_word(b, w + 1u), q8_word(b + 1u, w), q8_word(b + 1u, w + 1u)),
                          vec4<f32>(q8_scale(b), q8_scale(b), q8_scale(b + 1u), q8_scale(b + 1u)));
        }
        case T_Q6_K: {
            // Four runs of 4 elements, 32 apart: word (l % 8) of blocks 4 h .. 4 h + 4.
            let b = c0 + 8u * blk + 4u * (l / 8u);
            let w = l % 8u;
            return Q8Part(vec4<u32>(q8_word(b, w), q8_word(b + 1u, w), q8_word(b + 2u, w), q8_word(b + 3u, w)),
                          vec4<f32>(q8_scale(b), q8_scale(b + 1u), q8_scale(b + 2u), q8_scale(b + 3u)));
        }
        case T_Q4_0: {
            let b = c0 + blk;
            return Q8Part(vec4<u32>(q8_word(b, l), q8_word(b, l + 4u), 0u, 0u), vec4<f32>(q8_scale(b)));
        }
        default: {
            // Q8_0: elements 8 l .. + 8.
            let b = c0 + blk;
            return Q8Part(vec4<u32>(q8_word(b, 2u * l), q8_word(b, 2u * l + 1u), 0u, 0u), vec4<f32>(q8_scale(b)));
        }
    }
}

// The sum of the four signed bytes of `x`.
fn q8_sum(x: u32) -> i32 {
    return dot4I8Packed(0x01010101u, x);
}

// Lane `l`'s part of the weight block at byte `blk` dotted with its quantized activations:
// integer dots of 4 products per instruction, scaled per 32-element block.
fn part_dot_q8(blk: u32, l: u32, x: Q8Part) -> f32 {
    switch TYPE {
        case T_Q4_K: {
            let im = l / 4u;
            let l0 = 8u * (l % 4u);
            let k4 = k4_scales(blk, im);
            let q0 = w4(blk + 16u + 32u * im + l0);
            let q1 = w4(blk + 20u + 32u * im + l0);
            let dot_lo = f32(dot4I8Packed(lo_nibbles(q0), x.w.x) + dot4I8Packed(lo_nibbles(q1), x.w.y));
            let dot_hi = f32(dot4I8Packed(hi_nibbles(q0), x.w.z) + dot4I8Packed(hi_nibbles(q1), x.w.w));
            let sum_lo = f32(q8_sum(x.w.x) + q8_sum(x.w.y));
            let sum_hi = f32(q8_sum(x.w.z) + q8_sum(x.w.w));
            return x.d.x * (k4.lo.x * dot_lo - k4.lo.y * sum_lo) + x.d.z * (k4.hi.x * dot_hi - k4.hi.y * sum_hi);
        }
        case T_Q6_K: {
            let q6 = q6k_part(blk, l);
            let c = q6.q;
            // The 6-bit quants (0..63) dotted as they are, less 32 times the activations' sum.
            let dots = vec4<f32>(
                f32(dot4I8Packed(c.x, x.w.x) - 32 * q8_sum(x.w.x)),
                f32(dot4I8Packed(c.y, x.w.y) - 32 * q8_sum(x.w.y)),
                f32(dot4I8Packed(c.z, x.w.z) - 32 * q8_sum(x.w.z)),
                f32(dot4I8Packed(c.w, x.w.w) - 32 * q8_sum(x.w.w)));
            return f16_at(blk + 208u) * dot(q6.sc * x.d, dots);
        }
        case T_Q4_0: {
            let w = w2(blk + 2u + 4u * l);
            let s = dot4I8Packed(lo_nibbles(w), x.w.x) + dot4I8Packed(hi_nibbles(w), x.w.y)
                - 8 * (q8_sum(x.w.x) + q8_sum(x.w.y));
            return f16_at(blk) * x.d.x * f32(s);
        }
        default: {
            let qs = blk + 2u + 8u * l;
            let s = dot4I8Packed(w2(qs), x.w.x) + dot4I8Packed(w2(qs + 4u), x.w.y);
            return f16_at(blk) * x.d.x * f32(s);
        }
    }
}

var<workgroup> mv_partial: array<f32, 256>;

// Sums per invocation: (k MV_MAX_ROWS + r) MV_MAX_COLS + c for row r, column c, and k = 0
// (A's rows) or, with GLU, 1 (the second matrix's).
const MV_SUMS: u32 = 64u;

fn sum_slot(k: u32, r: u32, c: u32) -> u32 {
    return (k * MV_MAX_ROWS + r) * MV_MAX_COLS + c;
}

// Matrices a workgroup multiplies: 2 with GLU (gate and up), else 1.
fn mv_matrices() -> u32 {
    return select(1u, 2u, GLU);
}

// Writes the result of row r0 + r, column c: D at `out` (the product, or with GLU the SwiGLU
// silu(gate) * up, after the gate and up products at their own offsets c_ne.y and c_ne.z of
// D's buffer; one invocation writes all three, so the SwiGLU may share memory with either).
fn mv_write(out: u32, r0: u32, r: u32, c: u32, sums: vec2<f32>) {
    if (r0 + r >= p.d_ne.x) {
        return;
    }
    let at = (r0 + r) * p.d_nb.x + c * p.d_nb.y;
    if (GLU) {
        D[p.c_ne.y + at] = sums.x;
        D[p.c_ne.z + at] = sums.y;
        D[out + at] = sums.x / (1.0 + exp(-sums.x)) * sums.y;
    } else {
        D[out + at] = sums.x;
    }
}

// A team's sums: mv_matrices() x ROWS x NCOLS values per invocation, added over the team's
// TEAM invocations (team invocation `tl`, workgroup invocation `li`) and written by
// `mv_write`. With subgroups of 32 each is a subgroup sum (then, for a team of 128, 4 partials
// per value through workgroup memory); else a tree per value in the team's part of
// workgroup memory.
fn mv_store(li: u32, tl: u32, acc: array<f32, MV_SUMS>, r0: u32, i2: u32, i3: u32) {
    let out = p.off.w + i2 * p.d_nb.z + i3 * p.d_nb.w;
    if (SUBGROUP_ROWS && TEAM == 32u) {
        for (var r = 0u; r < ROWS; r++) {
            for (var c = 0u; c < NCOLS; c++) {
                var sums = vec2<f32>(0.0);
                for (var k = 0u; k < mv_matrices(); k++) {
                    sums[k] = row_total(acc[sum_slot(k, r, c)]);
                }
                if (tl == 0u) {
                    mv_write(out, r0, r, c, sums);
                }
            }
        }
        return;
    }
    if (SUBGROUP_ROWS) {
        for (var k = 0u; k < mv_matrices(); k++) {
            for (var r = 0u; r < ROWS; r++) {
                for (var c = 0u; c < NCOLS; c++) {
                    let s = row_total(acc[sum_slot(k, r, c)]);
                    if (li % 32u == 0u) {
                        mv_partial[sum_slot(k, r, c) * 4u + li / 32u] = s;
                    }
                }
            }
        }
        workgroupBarrier();
        if (li < ROWS * NCOLS) {
            let r = li / NCOLS;
            let c = li % NCOLS;
            var sums = vec2<f32>(0.0);
            for (var k = 0u; k < mv_matrices(); k++) {
                let at = sum_slot(k, r, c) * 4u;
                sums[k] = (mv_partial[at] + mv_partial[at + 1u]) + (mv_partial[at + 2u] + mv_partial[at + 3u]);
            }
            mv_write(out, r0, r, c, sums);
        }
        return;
    }
    for (var r = 0u; r < ROWS; r++) {
        for (var c = 0u; c < NCOLS; c++) {
            var sums = vec2<f32>(0.0);
            for (var k = 0u; k < mv_matrices(); k++) {
                mv_partial[li] = acc[sum_slot(k, r, c)];
                workgroupBarrier();
                for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
                    if (tl < s) {
                        mv_partial[li] += mv_partial[li + s];
                    }
                    workgroupBarrier();
                }
                sums[k] = mv_partial[li - tl];
                workgroupBarrier();
            }
            if (tl == 0u) {
                mv_write(out, r0, r, c, sums);
            }
        }
    }
}

// Workgroup w: with R = ROWS x 128 / TEAM, rows R (w % ceil(ne0 / R)) .. + R of matrix
// w / ceil(ne0 / R) (i2 + ne2 i3), ROWS for each team in order. Weight rows and activation rows as `kernels_fast.wgsl`'s mat-vec takes them
// (A in bytes, or 4-byte elements for F32; B in elements, 4-aligned: the host checks). With
// GLU, the up projection's weights are a second matrix of A's shape and strides at byte
// c_ne.x of A's buffer (see `mv_write`).
@compute @workgroup_size(128)
fn mul_mv_blocks(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let group_rows = ROWS * (MV_WG / TEAM);
    let groups = (p.d_ne.x + group_rows - 1u) / group_rows;
    let mat = w / groups;
    let i2 = mat % p.d_ne.z;
    let i3 = mat / p.d_ne.z;
    let tl = li % TEAM;
    let r0 = (w % groups) * group_rows + (li / TEAM) * ROWS;
    let lane = tl % lanes();
    let slots = TEAM / lanes();
    let blocks = p.a_ne.x / block_elems();
    let runs = part_runs(lane);
    var acc: array<f32, MV_SUMS>;
    if (i3 < p.d_ne.w) {
        let batch = (i2 / p.misc.y) * p.a_nb.z + (i3 / p.misc.z) * p.a_nb.w;
        let a0 = vec2<u32>(p.off.x, p.c_ne.x) + batch;
        let b0 = p.off.y + i2 * p.b_nb.z + i3 * p.b_nb.w;
        // DP4A: column c's first quantized block (columns of all matrices in order).
        let q0 = ((i3 * p.d_ne.z + i2) * p.d_ne.y) * (p.a_ne.x / 32u);
        for (var blk = tl / lanes(); blk < blocks; blk += slots) {
            for (var c = 0u; c < NCOLS; c++) {
                var x: Part;
                var xq: Q8Part;
                if (DP4A) {
                    xq = q8_part(q0 + c * (p.a_ne.x / 32u), blk, lane);
                } else {
                    x = load_part(b0 + c * p.b_nb.y + blk * block_elems(), runs);
                }
                for (var k = 0u; k < mv_matrices(); k++) {
                    for (var r = 0u; r < ROWS; r++) {
                        // Rows past the end read the last row again; their sums are not stored.
                        let row = min(r0 + r, p.d_ne.x - 1u);
                        let at = a0[k] + row * p.a_nb.y + blk * block_size();
                        if (DP4A) {
                            acc[sum_slot(k, r, c)] += part_dot_q8(at, lane, xq);
                        } else {
                            acc[sum_slot(k, r, c)] += part_dot(at, lane, x);
                        }
                    }
                }
            }
        }
    }
    mv_store(li, tl, acc, r0, i2, i3);
}
