// Kernels that sum in f64 as ggml-cpu does (compiled only where the adapter offers
// `SHADER_F64`; elsewhere `kernels.wgsl`'s f32 versions run). Prefixed with `common.wgsl`.

@group(0) @binding(4) var<storage, read_write> D: array<u32>;

fn dset(i: u32, v: f32) { D[i] = bitcast<u32>(v); }

// RMS_NORM as ggml-cpu: a sequential f64 sum of the f32 squares, the mean rounded to f32, then
// x * (1 / sqrt(mean + eps)) with correctly rounded sqrt and division.
@compute @workgroup_size(64)
fn rms_norm_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    var sum = 0.0lf;
    for (var k = 0u; k < p.a_ne.x; k++) {
        let x = af(a0 + k * p.a_nb.x);
        sum += f64(x * x);
    }
    let mean = f32(sum / f64(p.a_ne.x));
    let s = div_rn(1.0, sqrt_rn(mean + p.f.x));
    for (var k = 0u; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, af(a0 + k * p.a_nb.x) * s);
    }
}

// NORM as ggml-cpu's AVX-512 build: the mean from a sequential f64 sum rounded to f32, divided
// by n in f32; then `ggml_vec_cvar_f32`: d = x - mean, the squares' `hsum16` per group of 16
// added to an f64 sum, the tail's squares one by one, the variance that sum over n rounded to
// f32; d * (1 / sqrt(variance + eps)) with correctly rounded sqrt and divisions.
@compute @workgroup_size(64)
fn norm_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let n = p.a_ne.x;
    var sum = 0.0lf;
    for (var k = 0u; k < n; k++) {
        sum += f64(af(a0 + k * p.a_nb.x));
    }
    let mean = div_rn(f32(sum), f32(n));
    var squares = 0.0lf;
    let full = n - n % 16u;
    for (var k0 = 0u; k0 < full; k0 += 16u) {
        var sq: array<f32, 16>;
        for (var l = 0u; l < 16u; l++) {
            let v = f64(af(a0 + (k0 + l) * p.a_nb.x) - mean);
            // The f32 square (exact in f64, then rounded once), where a compiler cannot fuse
            // it into `hsum16`'s additions as it may a plain `v * v`.
            sq[l] = f32(v * v);
        }
        squares += f64(hsum16(sq));
    }
    for (var k = full; k < n; k++) {
        let v = af(a0 + k * p.a_nb.x) - mean;
        squares += f64(v * v);
    }
    let variance = f32(squares / f64(n));
    let s = div_rn(1.0, sqrt_rn(variance + p.f.x));
    for (var k = 0u; k < n; k++) {
        dset(d0 + k * p.d_nb.x, (af(a0 + k * p.a_nb.x) - mean) * s);
    }
}

// SOFT_MAX as ggml-cpu's AVX-512 build (see `soft_max` in kernels.wgsl for the parameters):
// w = x * scale + slope * mask, then exp(w - max) in groups of 16 through `v_expf16`, each
// group's `hsum16` added to an f64 sum, the tail through glibc's `expf` (`libm_expf`); the
// result times f32(1 / sum).
@compute @workgroup_size(64)
fn soft_max_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let c0 = soft_max_mask_row(row);
    let slope = alibi_slope(row.z);
    let n = p.a_ne.x;
    var m = bitcast<f32>(0xff800000u);
    for (var k = 0u; k < n; k++) {
        let w = soft_max_input(a0, c0, k, slope);
        dset(d0 + k * p.d_nb.x, w);
        m = max(m, w);
    }
    if (m == bitcast<f32>(0xff800000u)) {
        for (var k = 0u; k < n; k++) {
            dset(d0 + k * p.d_nb.x, 0.0);
        }
        return;
    }
    var sum = 0.0lf;
    let full = n - n % 16u;
    var v: array<f32, 16>;
    for (var k0 = 0u; k0 < full; k0 += 16u) {
        for (var l = 0u; l < 16u; l++) {
            let at_k = d0 + (k0 + l) * p.d_nb.x;
            v[l] = v_expf16(bitcast<f32>(D[at_k]) - m);
            dset(at_k, v[l]);
        }
        sum += f64(hsum16(v));
    }
    for (var k = full; k < n; k++) {
        let at_k = d0 + k * p.d_nb.x;
        let e = libm_expf(bitcast<f32>(D[at_k]) - m);
        sum += f64(e);
        dset(at_k, e);
    }
    var inv = 0.0;
    if (sum > 0.0lf) {
        inv = f32(1.0lf / sum);
    }
    for (var k = 0u; k < n; k++) {
        let at_k = d0 + k * p.d_nb.x;
        dset(at_k, bitcast<f32>(D[at_k]) * inv);
    }
}

// SILU (misc.y 0) and SWIGLU (misc.y 1: times B, of A's shape) as ggml-cpu's AVX-512 build:
// `silu_at` for whole groups of 16, the row's tail as `ggml_silu_f32`, x / (1 + expf(-x)),
// with glibc's `expf` and a correctly rounded division.
@compute @workgroup_size(64)
fn silu_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    let ne0 = p.d_ne.x;
    var y: f32;
    if (idx.x < ne0 - ne0 % 16u) {
        y = silu_at(x, idx.x, ne0);
    } else {
        y = div_rn(x, 1.0 + libm_expf(-x));
    }
    if (p.misc.y == 1u) {
        y = y * bf(p.off.y + at(idx, p.b_nb));
    }
    dset(p.off.w + at(idx, p.d_nb), y);
}

// ROPE's cos / sin table as ggml-cpu computes it: one invocation per (position, pair), writing
// (cosf(θ) · mscale, sinf(θ) · mscale) at D[2 i], θ from `rope_theta` (f32, as the CPU), and
// cosf / sinf as x86-64 glibc computes them (`libm_cosf` below), so the table is the CPU's bit
// for bit. misc.y: n_dims (even); misc.z: 1 with frequency factors in C.
@compute @workgroup_size(64)
fn rope_cache_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let pairs = p.misc.y / 2u;
    let theta = rope_theta(i / pairs, i % pairs);
    dset(p.off.w + 2u * i, libm_sincosf(theta, true) * p.f.w);
    dset(p.off.w + 2u * i + 1u, libm_sincosf(theta, false) * p.f.w);
}

// glibc's `sinf` / `cosf` (since 2.28; the algorithm of Arm's optimized-routines), which
// ggml-cpu's `sinf` / `cosf` calls run on x86-64 Linux: the argument reduced modulo π/2 in
// double (one product for |y| < 120, a 4/π table in fixed point above), then a sine or cosine
// polynomial in double, rounded once to float. GPU `sin` / `cos` are only accurate to a few
// ulp, and the demo model amplifies one ulp of a ROPE factor into visibly different logits.
//
// x86-64 glibc runs its FMA build on CPUs with FMA (the AVX-512 build llama.cpp's fixtures
// come from, and ours): there `x - n · π/2` is one fused operation, which matters near multiples
// of π/2. `SC_HPI_HI` keeps π/2's top 27 bits and `SC_HPI_LO` the rest, so n · hi and n · lo
// are exact for |n| < 128 and so is `x - n · hi`: the last subtraction is the only rounding,
// as in the fused form (and a compiler contracting either product changes nothing). The
// polynomials' own fusing moves a double by an ulp at most; no float in 87 million tested (every
// ROPE angle of positions below 2^17 for three bases and two sizes, and 50 million random
// floats) rounded differently.
const SC_HPI_INV: f64 = 10680707.430881744lf;
const SC_HPI_HI: f64 = 1.570796325802803lf;
const SC_HPI_LO: f64 = 9.920935184482005e-10lf;
const SC_PI63: f64 = 3.4061215800865545e-19lf;
const SC_C1: f64 = -0.49999999725108224lf;
const SC_C2: f64 = 0.041666623324344516lf;
const SC_C3: f64 = -0.001388676379437604lf;
const SC_C4: f64 = 2.4390450703564542e-05lf;
const SC_S1: f64 = -0.16666654943701084lf;
const SC_S2: f64 = 0.008332178146138854lf;
const SC_S3: f64 = -0.00019517298981385725lf;

// 4/π to 192 bits, 8 new bits per entry (glibc's `__inv_pio4`).
var<private> SC_INV_PIO4: array<u32, 24> = array<u32, 24>(
    0xa2u, 0xa2f9u, 0xa2f983u, 0xa2f9836eu,
    0xf9836e4eu, 0x836e4e44u, 0x6e4e4415u, 0x4e441529u,
    0x441529fcu, 0x1529fc27u, 0x29fc2757u, 0xfc2757d1u,
    0x2757d1f5u, 0x57d1f534u, 0xd1f534ddu, 0xf534ddc0u,
    0x34ddc0dbu, 0xddc0db62u, 0xc0db6295u, 0xdb629599u,
    0x6295993cu, 0x95993c43u, 0x993c4390u, 0x3c439041u
);

// The top 12 bits of a float without its sign (glibc's `abstop12`).
fn abstop12(x: f32) -> u32 {
    return (bitcast<u32>(x) >> 20u) & 0x7ffu;
}

// The full 64-bit product a · b as (high, low) words.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a1 = a >> 16u;
    let a0 = a & 0xffffu;
    let b1 = b >> 16u;
    let b0 = b & 0xffffu;
    let ll = a0 * b0;
    let lh = a0 * b1;
    let hl = a1 * b0;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    let hi = a1 * b1 + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, (ll & 0xffffu) | (mid << 16u));
}

// A reduced argument in [-π/4, π/4] and its quadrant.
struct Reduced {
    x: f64,
    n: u32,
}

// glibc's `reduce_large` for |y| >= 120 (bits `xi`): a 32 x 96-bit fixed-point product with
// 4/π gives the quadrant (2 bits) and the remainder (62 bits), the remainder as a signed
// 64-bit integer converted to double (the two words' sum rounds once, as the conversion does).
fn reduce_large(xi_in: u32) -> Reduced {
    let k = (xi_in >> 26u) & 15u;
    let shift = (xi_in >> 23u) & 7u;
    let xi = ((xi_in & 0xffffffu) | 0x800000u) << shift;
    let r0 = xi * SC_INV_PIO4[k];
    let r1 = mul_wide(xi, SC_INV_PIO4[k + 4u]);
    let r2 = mul_wide(xi, SC_INV_PIO4[k + 8u]);
    var res = u64_add(vec2<u32>(r0, r2.x), r1);
    let n = u64_add(res, vec2<u32>(0x20000000u, 0u)).x >> 30u;
    res = u64_sub(res, vec2<u32>(n << 30u, 0u));
    let x = f64(bitcast<i32>(res.x)) * 4294967296.0lf + f64(res.y);
    return Reduced(x * SC_PI63, n);
}

// glibc's `sinf_poly`: the sine polynomial of x for even n, else the cosine polynomial of x
// (negated with `neg`, glibc's second table), rounded to float.
fn sincosf_poly(x: f64, x2: f64, n: u32, neg: bool) -> f32 {
    if ((n & 1u) == 0u) {
        let x3 = x * x2;
        let s1 = SC_S2 + x2 * SC_S3;
        let x7 = x3 * x2;
        let s = x + x3 * SC_S1;
        return f32(s + x7 * s1);
    }
    let x4 = x2 * x2;
    let c2 = SC_C3 + x2 * SC_C4;
    let c1 = 1.0lf + x2 * SC_C1;
    let x6 = x4 * x2;
    let c = c1 + x4 * SC_C2;
    // Negating every coefficient negates every rounded step: the result is exactly -(c + ...).
    let r = c + x6 * c2;
    return f32(select(r, -r, neg));
}

// glibc's `cosf(y)` (`want_cos`) or `sinf(y)`.
fn libm_sincosf(y: f32, want_cos: bool) -> f32 {
    let top = abstop12(y);
    let odd = select(0u, 1u, want_cos);
    // |y| < π/4 (as abstop12 compares it): no reduction; tiny |y|: sin y = y, cos y = 1.
    if (top < 0x3f4u) {
        if (top < 0x398u) {
            return select(y, 1.0, want_cos);
        }
        let x = f64(y);
        return sincosf_poly(x, x * x, odd, false);
    }
    var x: f64;
    var n: u32;
    // The quadrant that picks the sign and the table (glibc adds y's sign for large |y|).
    var q: u32;
    if (top < 0x42fu) {
        let xd = f64(y);
        // hpi_inv is scaled by 2^24, so the rounded quadrant lands in bits 24..31.
        let ni = (i32(xd * SC_HPI_INV) + 0x800000) >> 24u;
        let nd = f64(ni);
        x = (xd - nd * SC_HPI_HI) - nd * SC_HPI_LO;
        n = bitcast<u32>(ni);
        q = n;
    } else if (top < 0x7f8u) {
        let xi = bitcast<u32>(y);
        let r = reduce_large(xi);
        x = r.x;
        n = r.n;
        q = n + (xi >> 31u);
    } else {
        // Infinity or NaN: NaN.
        return y - y;
    }
    let quadrant = q & 3u;
    let xs = select(x, -x, quadrant == 1u || quadrant == 2u);
    return sincosf_poly(xs, x * x, n ^ odd, (q & 2u) != 0u);
}

// glibc's `expf` (since 2.27; the algorithm of Arm's optimized-routines), which ggml-cpu calls
// for the tail of a SOFT_MAX or SiLU row (its last `ne0 % 16` elements: the vector loops take
// whole groups of 16). The device's `exp` is only accurate to a few ulp, and a router's
// softmax over 2 experts is all tail. glibc computes in double: k = round(x · 32/ln 2) and
// r = x · 32/ln 2 - k (each one fused operation in x86-64 glibc's FMA build), then
// 2^(k/32) from a table times a cubic in r, rounded once to float.
//
// Here x · 32/ln 2 is the exact sum ph + pl of two exact products (32/ln 2 split into 26 and 27
// significant bits against x's 24), so k = round(ph + pl) and r = (ph - k) + pl (ph - k is
// exact) are the fused results without relying on the device's `fma`. Checked on every one of
// the 2^32 floats against x86-64 glibc 2.36, bit for bit: on lavapipe, and in a transcription
// with the cubic's three multiply-adds fused or not in every combination (so whatever a
// compiler makes of them).
const EXPF_INV_LN2_HI: f64 = 46.16624069213867lf;
const EXPF_INV_LN2_LO: f64 = 6.163081565091488e-7lf;
const EXPF_C0: f64 = 1.6938359250920212e-6lf;
const EXPF_C1: f64 = 0.00023459809789509004lf;
const EXPF_C2: f64 = 0.021660849396613134lf;

// 2^(i/32) for i = 0..31 (glibc's `__exp2f_data.tab`, with the exponent bits it subtracts
// added back).
var<private> EXPF_T: array<f64, 32> = array<f64, 32>(
    1.0lf, 1.0218971486541166lf, 1.0442737824274138lf, 1.0671404006768237lf,
    1.0905077326652577lf, 1.1143867425958924lf, 1.1387886347566916lf, 1.1637248587775775lf,
    1.189207115002721lf, 1.215247359980469lf, 1.241857812073484lf, 1.2690509571917332lf,
    1.2968395546510096lf, 1.3252366431597413lf, 1.3542555469368927lf, 1.383909881963832lf,
    1.4142135623730951lf, 1.4451808069770467lf, 1.4768261459394993lf, 1.5091644275934228lf,
    1.5422108254079407lf, 1.5759808451078865lf, 1.6104903319492543lf, 1.645755478153965lf,
    1.681792830507429lf, 1.718619298122478lf, 1.7562521603732995lf, 1.7947090750031072lf,
    1.8340080864093424lf, 1.8741676341103lf, 1.9152065613971474lf, 1.9571441241754002lf
);

// 2^e exactly, for |e| <= 252: two normal powers of two of float, multiplied in double (WGSL
// has no 64-bit integers to build the double's bits).
fn pow2_f64(e: i32) -> f64 {
    let h = e / 2;
    let a = bitcast<f32>(u32(h + 127) << 23u);
    let b = bitcast<f32>(u32(e - h + 127) << 23u);
    return f64(a) * f64(b);
}

// glibc's `expf(x)`, bit for bit.
fn libm_expf(x: f32) -> f32 {
    let top = abstop12(x);
    // |x| >= 88, infinity or NaN: glibc's special cases (its overflow, underflow and
    // "may underflow" results); from -103.28 to -88 its main path follows.
    if (top >= 0x42bu) {
        if (bitcast<u32>(x) == 0xff800000u) {
            return 0.0;
        }
        if (top >= 0x7f8u) {
            return x + x;
        }
        if (x > bitcast<f32>(0x42b17217u)) {
            return bitcast<f32>(0x7f800000u);
        }
        if (x < bitcast<f32>(0xc2cff1b4u)) {
            return 0.0;
        }
        if (x < bitcast<f32>(0xc2ce8ecfu)) {
            // 0x1.4p-75f squared: the smallest subnormal.
            return bitcast<f32>(1u);
        }
    }
    let xd = f64(x);
    let ph = xd * EXPF_INV_LN2_HI;
    let pl = xd * EXPF_INV_LN2_LO;
    let kd = round(ph + pl);
    let r = (ph - kd) + pl;
    let k = i32(kd);
    let s = EXPF_T[k & 31] * pow2_f64(k >> 5u);
    let z = EXPF_C0 * r + EXPF_C1;
    let y = z * (r * r) + (EXPF_C2 * r + 1.0lf);
    return f32(y * s);
}
