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

// SILU: x * sigmoid(x).
@compute @workgroup_size(64)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    dset(p.off.w + at(idx, p.d_nb), x / (1.0 + exp(-x)));
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
    let s = 1.0 / sqrt(sum / f32(p.a_ne.x) + p.f.x);
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
    let c0 = p.off.z + row.y * p.c_nb.y + (row.z % p.c_ne.z) * p.c_nb.z + (row.w % p.c_ne.w) * p.c_nb.w;
    let has_mask = p.misc.y == 1u;
    let mask_f16 = p.misc.z == T_F16;
    var slope = 1.0;
    if (p.f.y != 1.0 || p.f.z != 1.0) {
        if (row.z < p.misc.w) {
            slope = pow(p.f.y, f32(row.z + 1u));
        } else {
            slope = pow(p.f.z, f32(2u * (row.z - p.misc.w) + 1u));
        }
    }
    var m = -3.4028235e38;
    for (var k = 0u; k < p.a_ne.x; k++) {
        var x = af(a0 + k * p.a_nb.x) * p.f.x;
        if (has_mask) {
            if (mask_f16) {
                x += slope * c_f16(c0 + k * p.c_nb.x);
            } else {
                x += slope * cf(c0 + k * p.c_nb.x);
            }
        }
        m = max(m, x);
    }
    var sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        var x = af(a0 + k * p.a_nb.x) * p.f.x;
        if (has_mask) {
            if (mask_f16) {
                x += slope * c_f16(c0 + k * p.c_nb.x);
            } else {
                x += slope * cf(c0 + k * p.c_nb.x);
            }
        }
        let e = exp(x - m);
        sum += e;
        dset(d0 + k * p.d_nb.x, e);
    }
    let inv = 1.0 / sum;
    for (var k = 0u; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, df(d0 + k * p.d_nb.x) * inv);
    }
}

// MUL_MAT: D[i0, i1, i2, i3] = sum_k A[k, i0, i2 / misc.y, i3 / misc.z] * B[k, i1, i2, i3], A of
// type misc.w (f32, f16 or quantized, dequantized here), B f32.
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
    var sum = 0.0;
    if (t == T_F32) {
        for (var k = 0u; k < p.a_ne.x; k++) {
            sum += af(a0 + k * p.a_nb.x) * bf(b0 + k * p.b_nb.x);
        }
    } else {
        for (var k = 0u; k < p.a_ne.x; k++) {
            sum += a_elem(t, a0, k, p.a_nb.x) * bf(b0 + k * p.b_nb.x);
        }
    }
    dset(p.off.w + at(idx, p.d_nb), sum);
}

// SWIGLU: silu(A) * B (equal shapes).
@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    let y = bf(p.off.y + at(idx, p.b_nb));
    dset(p.off.w + at(idx, p.d_nb), x / (1.0 + exp(-x)) * y);
}

// GELU, ggml's tanh approximation (the tanh argument clamped, where tanh is already +-1 in f32).
@compute @workgroup_size(64)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = af(p.off.x + at(idx, p.a_nb));
    let u = clamp(0.7978845608028654 * x * (1.0 + 0.044715 * x * x), -15.0, 15.0);
    dset(p.off.w + at(idx, p.d_nb), 0.5 * x * (1.0 + tanh(u)));
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

// ROPE, one invocation per row (i1, i2, i3) of A, position B[i2]. misc.y: n_dims; misc.z: 0
// normal (adjacent pairs), 1 NeoX (halves); f: (theta_scale, freq_scale, ext_factor, mscale);
// g.xy: YaRN correction range. Dimensions from n_dims on are copied.
@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let n_dims = p.misc.y;
    let pos = f32(bitcast<i32>(B[p.off.y + row.z * p.b_nb.x]));
    for (var k = n_dims; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, af(a0 + k * p.a_nb.x));
    }
    for (var i0 = 0u; i0 < n_dims; i0 += 2u) {
        let half = f32(i0 / 2u);
        let theta_extrap = pos * pow(p.f.x, half);
        let theta_interp = p.f.y * theta_extrap;
        var theta = theta_interp;
        if (p.f.z != 0.0) {
            let y = (half - p.g.x) / max(p.g.y - p.g.x, 0.001);
            let ramp_mix = (1.0 - clamp(y, 0.0, 1.0)) * p.f.z;
            theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        }
        let c = cos(theta) * p.f.w;
        let s = sin(theta) * p.f.w;
        var ia = i0;
        var ib = i0 + 1u;
        if (p.misc.z == 1u) {
            ia = i0 / 2u;
            ib = i0 / 2u + n_dims / 2u;
        }
        let x0 = af(a0 + ia * p.a_nb.x);
        let x1 = af(a0 + ib * p.a_nb.x);
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
