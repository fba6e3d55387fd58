// What the word-reading rgml WGSL modules share (after `params.wgsl`): the source bindings and
// their readers. `kernels.wgsl` and `kernels_f16.wgsl` add the destination binding D and kernels.
//
// rgml's WGSL kernels are naive (one invocation per output element or row).
//
// Every kernel shares one bind group layout: a uniform block of shapes, strides and offsets
// (`params.wgsl`), and four storage bindings (A, B, C: sources; D: destination), all `array<u32>` (f32 values are
// bitcast). Strides and offsets of 4-byte tensors (f32, i32) are in 4-byte elements; those of
// f16 and quantized tensors are in bytes. Bindings are all read_write so that one buffer may be
// bound several times in one dispatch (tensors of a graph usually share a buffer).

@group(0) @binding(1) var<storage, read_write> A: array<u32>;
@group(0) @binding(2) var<storage, read_write> B: array<u32>;
@group(0) @binding(3) var<storage, read_write> C: array<u32>;

const WG: u32 = 64u;

// SET_ROWS's destination row for source element `idx` (C holds i32 indices [ne1, k2, k3]).
fn set_rows_index(idx: vec4<u32>) -> i32 {
    return bitcast<i32>(C[p.off.z + idx.y * p.c_nb.x + (idx.z % p.c_ne.y) * p.c_nb.y + (idx.w % p.c_ne.z) * p.c_nb.z]);
}

// Words per block of quantized activations in the scratch buffer (`quantize_q8`): the f16-rounded
// scale and the f16-rounded `d * sum(q)` as f32, then 32 signed bytes.
const Q8_WORDS: u32 = 10u;

// Element 0 of 32-element block `i` of B's rows (blocks of rows in order): what the Q8
// activation quantizers (`quantize_q8`, `quantize_q8_fast`) take per invocation.
fn b_block(i: u32) -> u32 {
    let nbpr = p.b_ne.x / 32u;
    let row = unravel_row(i / nbpr, p.b_ne);
    return p.off.y + at(row, p.b_nb) + (i % nbpr) * 32u * p.b_nb.x;
}

fn af(i: u32) -> f32 { return bitcast<f32>(A[i]); }
fn bf(i: u32) -> f32 { return bitcast<f32>(B[i]); }
fn cf(i: u32) -> f32 { return bitcast<f32>(C[i]); }

// Byte `b` of A.
fn a_u8(b: u32) -> u32 {
    return (A[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The f16 at (2-aligned) byte `b` of A / C.
fn a_f16(b: u32) -> f32 {
    return unpack2x16float(A[b >> 2u] >> ((b & 2u) * 8u)).x;
}
fn c_f16(b: u32) -> f32 {
    return unpack2x16float(C[b >> 2u] >> ((b & 2u) * 8u)).x;
}

// Element `k` of a row of A of type `t` starting at `base` (elements for f32, bytes otherwise),
// with element stride `nb0` (elements for f32, bytes for f16; unused for quantized blocks).
fn a_elem(t: u32, base: u32, k: u32, nb0: u32) -> f32 {
    switch t {
        case T_F32: { return af(base + k * nb0); }
        case T_F16: { return a_f16(base + k * nb0); }
        case T_Q4_0: {
            let blk = base + (k / 32u) * 18u;
            let j = k % 32u;
            let q = a_u8(blk + 2u + (j % 16u));
            let n = select(q & 0xfu, q >> 4u, j >= 16u);
            return (f32(n) - 8.0) * a_f16(blk);
        }
        case T_Q4_1: {
            let blk = base + (k / 32u) * 20u;
            let j = k % 32u;
            let q = a_u8(blk + 4u + (j % 16u));
            let n = select(q & 0xfu, q >> 4u, j >= 16u);
            return f32(n) * a_f16(blk) + a_f16(blk + 2u);
        }
        case T_Q4_K: {
            // 256 per block: d, dmin (f16), 12 bytes of 6-bit scales and mins for the 8
            // sub-blocks of 32, then 128 bytes of nibbles (64 elements per 32 bytes: low
            // nibbles first, then high).
            let blk = base + (k / 256u) * 144u;
            let j = k % 256u;
            let sb = j / 32u;
            var sc: u32;
            var mn: u32;
            if (sb < 4u) {
                sc = a_u8(blk + 4u + sb) & 63u;
                mn = a_u8(blk + 8u + sb) & 63u;
            } else {
                sc = (a_u8(blk + 8u + sb) & 0xfu) | ((a_u8(blk + sb) >> 6u) << 4u);
                mn = (a_u8(blk + 8u + sb) >> 4u) | ((a_u8(blk + 4u + sb) >> 6u) << 4u);
            }
            let l = j % 64u;
            let q = a_u8(blk + 16u + (j / 64u) * 32u + (l % 32u));
            let n = select(q & 0xfu, q >> 4u, l >= 32u);
            return a_f16(blk) * f32(sc) * f32(n) - a_f16(blk + 2u) * f32(mn);
        }
        case T_Q6_K: {
            // 256 per block: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed scales
            // (one per 16), d (f16). Each 128-element half splits in quarters of 32.
            let blk = base + (k / 256u) * 210u;
            let j = k % 256u;
            let h = j / 128u;
            let quarter = (j % 128u) / 32u;
            let l = j % 32u;
            let lo = a_u8(blk + 64u * h + l + (quarter & 1u) * 32u);
            let nib = select(lo & 0xfu, lo >> 4u, quarter >= 2u);
            let hi = (a_u8(blk + 128u + 32u * h + l) >> (2u * quarter)) & 3u;
            let q = i32(nib | (hi << 4u)) - 32;
            let s = a_u8(blk + 192u + 8u * h + l / 16u + 2u * quarter);
            let sc = select(i32(s), i32(s) - 256, s >= 128u);
            return a_f16(blk + 208u) * f32(sc) * f32(q);
        }
        default: {
            let blk = base + (k / 32u) * 34u;
            let q = a_u8(blk + 2u + k % 32u);
            let v = select(i32(q), i32(q) - 256, q >= 128u);
            return f32(v) * a_f16(blk);
        }
    }
}

// The f16 nearest to `v` (ties to even), as the low 16 bits: exact integer arithmetic, because
// the rounding of WGSL's `pack2x16float` is implementation-defined and f16 results must equal
// the CPU's bit for bit. Overflow gives infinity; NaN stays NaN.
fn f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let e = i32((x >> 23u) & 0xffu);
    var m = x & 0x7fffffu;
    if (e == 255) {
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    // Exponent of the result, with the f16 bias.
    let he = e - 127 + 15;
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    var shift = 13u;
    var base = u32(max(he, 0)) << 10u;
    if (he <= 0) {
        // Subnormal f16: the implicit bit joins the mantissa, shifted further.
        if (he < -10) {
            return sign;
        }
        m = m | 0x800000u;
        shift = u32(14 - he);
        base = 0u;
    }
    let q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let halfway = 1u << (shift - 1u);
    var r = base + q;
    if (rem > halfway || (rem == halfway && (q & 1u) == 1u)) {
        // A carry out of the mantissa correctly bumps the exponent (up to infinity).
        r += 1u;
    }
    return sign | r;
}

// `v` rounded to the nearest f16, as f32.
fn round_f16(v: f32) -> f32 {
    return unpack2x16float(f16_bits(v)).x;
}

// The 4 bytes of A from (any) byte `b`, little-endian.
fn a_u32(b: u32) -> u32 {
    let w = b >> 2u;
    let sh = (b & 3u) * 8u;
    if (sh == 0u) {
        return A[w];
    }
    return (A[w] >> sh) | (A[w + 1u] << (32u - sh));
}

// Byte `k` (0..4) of `w` as a signed 8-bit value.
fn i8_of(w: u32, k: u32) -> i32 {
    return bitcast<i32>(w << (24u - 8u * k)) >> 24u;
}

// Whether the device's `fma` rounds once (probed when the device opens). Where it does not
// (lavapipe rounds the product first), `fma_x` computes the fused result in integer arithmetic:
// the CPU kernels we mirror use fused multiply-adds, and every bit counts.
override HW_FMA: bool = false;

// Unsigned 64-bit values as (high, low) words.
fn u64_shl(x: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) {
        return x;
    }
    if (s >= 32u) {
        return vec2<u32>(x.y << (s - 32u), 0u);
    }
    return vec2<u32>((x.x << s) | (x.y >> (32u - s)), x.y << s);
}

fn u64_shr(x: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) {
        return x;
    }
    if (s >= 64u) {
        return vec2<u32>(0u, 0u);
    }
    if (s >= 32u) {
        return vec2<u32>(0u, x.x >> (s - 32u));
    }
    return vec2<u32>(x.x >> s, (x.y >> s) | (x.x << (32u - s)));
}

// x >> s with every bit shifted out OR-ed into bit 0 (the sticky bit of rounding).
fn u64_shr_sticky(x: vec2<u32>, s: u32) -> vec2<u32> {
    var r = u64_shr(x, s);
    let back = u64_shl(r, min(s, 63u));
    if (s >= 64u) {
        r = vec2<u32>(0u, 0u);
        if (any(x != vec2<u32>(0u, 0u))) {
            r.y = 1u;
        }
        return r;
    }
    if (any(back != x)) {
        r.y |= 1u;
    }
    return r;
}

fn u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.y + b.y;
    return vec2<u32>(a.x + b.x + select(0u, 1u, lo < a.y), lo);
}

fn u64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x - select(0u, 1u, a.y < b.y), a.y - b.y);
}

fn u64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

// Index of the highest set bit (-1 for zero).
fn u64_msb(x: vec2<u32>) -> i32 {
    if (x.x != 0u) {
        return 32 + i32(firstLeadingBit(x.x));
    }
    if (x.y != 0u) {
        return i32(firstLeadingBit(x.y));
    }
    return -1;
}

// a * b + c rounded once (ties to even): the exact 48-bit product and c are aligned in 62-bit
// integers (the smaller shifted right with a sticky bit), added, and rounded to 24 bits.
// Infinities, NaNs and zero factors take the plain expression, which is exact there.
fn fma_soft(a: f32, b: f32, c: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let cb = bitcast<u32>(c);
    let ea = (ab >> 23u) & 0xffu;
    let eb = (bb >> 23u) & 0xffu;
    let ec = (cb >> 23u) & 0xffu;
    if (ea == 255u || eb == 255u || ec == 255u || (ab & 0x7fffffffu) == 0u || (bb & 0x7fffffffu) == 0u) {
        return a * b + c;
    }
    if ((cb & 0x7fffffffu) == 0u) {
        return a * b;
    }
    let ma = (ab & 0x7fffffu) | select(0x800000u, 0u, ea == 0u);
    let mb = (bb & 0x7fffffu) | select(0x800000u, 0u, eb == 0u);
    let mc = (cb & 0x7fffffu) | select(0x800000u, 0u, ec == 0u);
    // Value = mantissa * 2^E.
    let e_p = i32(max(ea, 1u)) + i32(max(eb, 1u)) - 300;
    let e_c = i32(max(ec, 1u)) - 150;
    // The 48-bit product from 16-bit halves.
    let a1 = ma >> 16u;
    let a0 = ma & 0xffffu;
    let b1 = mb >> 16u;
    let b0 = mb & 0xffffu;
    let cross = a1 * b0 + a0 * b1;
    let ll = a0 * b0;
    let lo = ll + (cross << 16u);
    let prod = vec2<u32>(a1 * b1 + (cross >> 16u) + select(0u, 1u, lo < ll), lo);
    let pm = u64_msb(prod);
    var x = u64_shl(prod, u32(61 - pm));
    var ex = e_p - (61 - pm);
    var sx = (ab ^ bb) >> 31u;
    let cm = i32(firstLeadingBit(mc));
    var y = u64_shl(vec2<u32>(0u, mc), u32(61 - cm));
    var ey = e_c - (61 - cm);
    var sy = cb >> 31u;
    if (ey > ex || (ey == ex && u64_lt(x, y))) {
        let t = x;
        x = y;
        y = t;
        let te = ex;
        ex = ey;
        ey = te;
        let ts = sx;
        sx = sy;
        sy = ts;
    }
    y = u64_shr_sticky(y, u32(min(ex - ey, 64)));
    var r: vec2<u32>;
    if (sx == sy) {
        r = u64_add(x, y);
    } else {
        r = u64_sub(x, y);
    }
    let rm = u64_msb(r);
    if (rm < 0) {
        return 0.0;
    }
    // Shift to a 24-bit mantissa; below the normal range, to the subnormal scale 2^-149.
    var sh = rm - 23;
    var be = ex + sh + 150;
    if (be <= 0) {
        sh = -149 - ex;
        be = 0;
    }
    var m: u32;
    if (sh <= 0) {
        m = u64_shl(r, u32(-sh)).y;
    } else if (sh >= 64) {
        m = 0u;
    } else {
        let q = u64_shr(r, u32(sh));
        m = q.y;
        let rem = u64_sub(r, u64_shl(q, u32(sh)));
        let half = u64_shl(vec2<u32>(0u, 1u), u32(sh - 1));
        if (u64_lt(half, rem) || (all(rem == half) && (m & 1u) == 1u)) {
            m += 1u;
        }
    }
    var bits: u32;
    if (be == 0) {
        // Subnormal; rounding up to 2^23 lands exactly on the smallest normal.
        bits = m;
    } else {
        // The mantissa's leading bit adds one to the exponent field, and a carry out of the
        // rounding adds another, as it must.
        bits = ((u32(be) - 1u) << 23u) + m;
        if (be >= 255 || bits >= 0x7f800000u) {
            bits = 0x7f800000u;
        }
    }
    return bitcast<f32>(bits | (sx << 31u));
}

// a * b + c with one rounding, on every device.
fn fma_x(a: f32, b: f32, c: f32) -> f32 {
    if (HW_FMA) {
        return fma(a, b, c);
    }
    return fma_soft(a, b, c);
}

// The next float above / below a positive finite `x`.
fn next_up(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) + 1u); }
fn next_down(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) - 1u); }

// a / b correctly rounded (IEEE division, as the CPU computes it), for finite normal a and b
// (other operands take plain division): WGSL's division may be off by 2.5 ulp, so the quotient moves to whichever neighbour
// leaves the smallest exact remainder (fma computes a - q b without rounding). Quotients of
// floats never lie exactly halfway between two floats, so there are no ties.
fn div_rn(a_in: f32, b_in: f32) -> f32 {
    let a = abs(a_in);
    let b = abs(b_in);
    let negative = (a_in < 0.0) != (b_in < 0.0);
    var q = a / b;
    if (!(a > 1.0e-36 && b > 1.0e-36 && q > 1.0e-36 && q < 1.0e36 && b < 1.0e36 && a < 1.0e36)) {
        return a_in / b_in;
    }
    for (var k = 0; k < 3; k++) {
        let r = abs(fma_x(-q, b, a));
        let up = next_up(q);
        let dn = next_down(q);
        let ru = abs(fma_x(-up, b, a));
        let rd = abs(fma_x(-dn, b, a));
        if (ru < r) {
            q = up;
        } else if (rd < r) {
            q = dn;
        } else {
            break;
        }
    }
    return select(q, -q, negative);
}

// sqrt(x) correctly rounded, for positive finite normal x (WGSL's sqrt may be inexact); as
// `div_rn`, by the smallest exact remainder x - s^2.
fn sqrt_rn(x: f32) -> f32 {
    var s = sqrt(x);
    if (!(x > 1.0e-36 && x < 1.0e36)) {
        return s;
    }
    for (var k = 0; k < 3; k++) {
        let r = abs(fma_x(-s, s, x));
        let up = next_up(s);
        let dn = next_down(s);
        let ru = abs(fma_x(-up, up, x));
        let rd = abs(fma_x(-dn, dn, x));
        if (ru < r) {
            s = up;
        } else if (rd < r) {
            s = dn;
        } else {
            break;
        }
    }
    return s;
}

// Which of a token's four positions pair `k` rotates by in the multi-section modes (a_nb.x:
// 1 MROPE, 2 IMROPE, 0 the one-position modes; a_ne: the pairs per section), as
// `rgml::RopeMode::position_of_pair` (ggml's `ggml_mrope_cache_init`) picks it.
fn rope_section(k: u32) -> u32 {
    let s = p.a_ne;
    let total = s.x + s.y + s.z + s.w;
    if (p.a_nb.x == 0u || total == 0u) {
        return 0u;
    }
    let sector = k % total;
    if (p.a_nb.x == 2u) {
        let m = sector % 3u;
        if (m == 1u && sector < 3u * s.y) {
            return 1u;
        }
        if (m == 2u && sector < 3u * s.z) {
            return 2u;
        }
        if (m == 0u && sector < 3u * s.x) {
            return 0u;
        }
        return 3u;
    }
    if (sector < s.x) {
        return 0u;
    }
    if (sector < s.x + s.y) {
        return 1u;
    }
    if (sector < s.x + s.y + s.z) {
        return 2u;
    }
    return 3u;
}

// ROPE's angle for pair `k` of the token at index `i` (its position at index `i` of B, i32;
// in the multi-section modes the position `rope_section(k)` of it, a_nb.y tokens apart), as
// ggml-cpu computes it in f32 (`rope_yarn` after `ggml_rope_cache_init`): θ_extrap = pos · θ_scale^k by k successive
// products (not `pow`: every rounding of the chain counts), divided by the pair's frequency
// factor (f32 C[k], when misc.z is 1) with IEEE rounding, θ_interp = freq_scale · θ_extrap,
// and with YaRN (ext_factor ≠ 0) the ramp between the correction dims mixing the two. f:
// (θ_scale, freq_scale, ext_factor, mscale); g.xy: correction dims; b_nb.x, c_nb.x: strides.
fn rope_theta(i: u32, k: u32) -> f32 {
    let pos = f32(bitcast<i32>(B[p.off.y + (i + rope_section(k) * p.a_nb.y) * p.b_nb.x]));
    var theta_extrap = pos;
    for (var j = 0u; j < k; j++) {
        theta_extrap = theta_extrap * p.f.x;
    }
    if (p.misc.z == 1u) {
        theta_extrap = div_rn(theta_extrap, cf(p.off.z + k * p.c_nb.x));
    }
    let theta_interp = p.f.y * theta_extrap;
    if (p.f.z == 0.0) {
        return theta_interp;
    }
    let y = div_rn(f32(k) - p.g.x, max(p.g.y - p.g.x, 0.001));
    let mix = (1.0 - clamp(y, 0.0, 1.0)) * p.f.z;
    // ggml's `theta_interp * (1 - mix) + theta_extrap * mix`, the first product fused into the
    // sum as GCC compiles it.
    return fma_x(theta_interp, 1.0 - mix, theta_extrap * mix);
}

// Sum of 8 lanes in the order of ggml's AVX `hsum_float_8` (high half + low half, then
// `movehl` pairs, then the last two), so GPU dot products round as the CPU's do.
fn hsum8(v: array<f32, 8>) -> f32 {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// ggml's AVX-512 `ggml_v_expf` for one lane: the same reduction and polynomial with fused
// multiply-adds, scaled by 2^n in one rounding (`vscalefps`; ldexp is exact for normal
// results). |n| > 192 gives 0 or infinity.
fn v_expf16(x: f32) -> f32 {
    let r = bitcast<f32>(0x4b400000u);
    let z = fma_x(x, bitcast<f32>(0x3fb8aa3bu), r);
    let n = z - r;
    let b = fma_x(-n, bitcast<f32>(0x35bfbe8eu), fma_x(-n, bitcast<f32>(0x3f317200u), x));
    let u = b * b;
    let p5 = bitcast<f32>(0x3c072010u);
    let p4 = bitcast<f32>(0x3d2b9f17u);
    let p3 = bitcast<f32>(0x3e2aaf33u);
    let p2 = bitcast<f32>(0x3efffedbu);
    let p1 = bitcast<f32>(0x3f7ffff6u);
    let j = fma_x(fma_x(fma_x(p5, b, p4), u, fma_x(p3, b, p2)), u, fma_x(p1, b, 1.0));
    if (abs(n) > 192.0) {
        return select(bitcast<f32>(0x7f800000u), 0.0, n <= 0.0);
    }
    return ldexp(j, i32(n));
}

// SiLU of element `k` of a row of `ne0`, as ggml-cpu's AVX-512 build: whole groups of 16 through
// `ggml_v_silu` (x / (1 + v_expf(-x)), correctly rounded division), the row's tail through libm
// `expf` (here the device's exp, which may differ in the last bit; `silu_f64` computes glibc's).
fn silu_at(x: f32, k: u32, ne0: u32) -> f32 {
    if (k < ne0 - ne0 % 16u) {
        return div_rn(x, 1.0 + v_expf16(0.0 - x));
    }
    return x / (1.0 + exp(-x));
}

// Sum of 16 lanes in the order of `_mm512_reduce_add_ps`: high 8 + low 8, then `hsum8`.
fn hsum16(v: array<f32, 16>) -> f32 {
    var h: array<f32, 8>;
    for (var l = 0u; l < 8u; l++) {
        h[l] = v[l] + v[l + 8u];
    }
    return hsum8(h);
}

// SOFT_MAX's ALiBi slope of head `h`: f.y^(h + 1) below misc.w heads, f.z^(2 (h - misc.w) + 1)
// from there (1 without ALiBi).
fn alibi_slope(h: u32) -> f32 {
    if (p.f.y == 1.0 && p.f.z == 1.0) {
        return 1.0;
    }
    if (h < p.misc.w) {
        return pow(p.f.y, f32(h + 1u));
    }
    return pow(p.f.z, f32(2u * (h - p.misc.w) + 1u));
}

// SOFT_MAX's input k of the row at `a0` (A) whose mask row is at `c0` (C, when misc.y is 1; f16
// when misc.z is T_F16): x * scale + slope * mask.
fn soft_max_input(a0: u32, c0: u32, k: u32, slope: f32) -> f32 {
    var x = af(a0 + k * p.a_nb.x) * p.f.x;
    if (p.misc.y == 1u) {
        var m: f32;
        if (p.misc.z == T_F16) {
            m = c_f16(c0 + k * p.c_nb.x);
        } else {
            m = cf(c0 + k * p.c_nb.x);
        }
        x = x + slope * m;
    }
    return x;
}

// The mask row (in C) of SOFT_MAX row `row`: rows by i1, broadcast over dims 2 and 3.
fn soft_max_mask_row(row: vec4<u32>) -> u32 {
    return p.off.z + row.y * p.c_nb.y + (row.z % p.c_ne.z) * p.c_nb.z + (row.w % p.c_ne.w) * p.c_nb.w;
}

fn thread_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// Element index -> (i0, i1, i2, i3) for shape `ne`.
fn unravel(i: u32, ne: vec4<u32>) -> vec4<u32> {
    let i0 = i % ne.x;
    let r1 = i / ne.x;
    let i1 = r1 % ne.y;
    let r2 = r1 / ne.y;
    let i2 = r2 % ne.z;
    let i3 = r2 / ne.z;
    return vec4<u32>(i0, i1, i2, i3);
}

// Row index -> (0, i1, i2, i3) for shape `ne`.
fn unravel_row(r: u32, ne: vec4<u32>) -> vec4<u32> {
    let i1 = r % ne.y;
    let r2 = r / ne.y;
    let i2 = r2 % ne.z;
    let i3 = r2 / ne.z;
    return vec4<u32>(0u, i1, i2, i3);
}

fn at(idx: vec4<u32>, nb: vec4<u32>) -> u32 {
    return idx.x * nb.x + idx.y * nb.y + idx.z * nb.z + idx.w * nb.w;
}

