// rgml's first WGSL kernels: f32 only, naive (one invocation per output element or per row).
//
// Every kernel shares one bind group layout: a uniform block of shapes, strides and offsets, and
// four storage bindings (A, B, C: sources; D: destination). Strides and offsets are in f32
// elements (4 bytes). Bindings are all read_write so that one buffer may be bound several times
// in one dispatch (tensors of a graph usually share a buffer).

struct P {
    a_ne: vec4<u32>,
    a_nb: vec4<u32>,
    b_ne: vec4<u32>,
    b_nb: vec4<u32>,
    c_ne: vec4<u32>,
    c_nb: vec4<u32>,
    d_ne: vec4<u32>,
    d_nb: vec4<u32>,
    // Element offsets of A, B, C, D in their buffers.
    off: vec4<u32>,
    // x: invocations to run; y: op code / flag; z, w: kernel-specific.
    misc: vec4<u32>,
    // Kernel-specific floats (scale, bias, eps).
    f: vec4<f32>,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
@group(0) @binding(4) var<storage, read_write> D: array<f32>;

const WG: u32 = 64u;

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

// ADD / SUB / MUL / DIV with src1 broadcast (misc.y: 0 add, 1 sub, 2 mul, 3 div).
@compute @workgroup_size(64)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = A[p.off.x + at(idx, p.a_nb)];
    let y = B[p.off.y + at(idx % p.b_ne, p.b_nb)];
    var r: f32;
    switch p.misc.y {
        case 0u: { r = x + y; }
        case 1u: { r = x - y; }
        case 2u: { r = x * y; }
        default: { r = x / y; }
    }
    D[p.off.w + at(idx, p.d_nb)] = r;
}

// SCALE: x * f.x + f.y.
@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    D[p.off.w + at(idx, p.d_nb)] = A[p.off.x + at(idx, p.a_nb)] * p.f.x + p.f.y;
}

// SILU: x * sigmoid(x).
@compute @workgroup_size(64)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let x = A[p.off.x + at(idx, p.a_nb)];
    D[p.off.w + at(idx, p.d_nb)] = x / (1.0 + exp(-x));
}

// CPY / CONT / DUP: element i of A (in A's shape) to element i of D (in D's shape).
@compute @workgroup_size(64)
fn cpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    D[p.off.w + at(unravel(i, p.d_ne), p.d_nb)] = A[p.off.x + at(unravel(i, p.a_ne), p.a_nb)];
}

// GET_ROWS: D[i0, i1, i2, i3] = A[i0, B[i1, i2, i3], i2, i3] (B holds i32 indices).
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
        v = A[p.off.x + at(vec4<u32>(idx.x, u32(row), idx.z, idx.w), p.a_nb)];
    }
    D[p.off.w + at(idx, p.d_nb)] = v;
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
        let x = A[a0 + k * p.a_nb.x];
        sum += x * x;
    }
    let s = 1.0 / sqrt(sum / f32(p.a_ne.x) + p.f.x);
    for (var k = 0u; k < p.a_ne.x; k++) {
        D[d0 + k * p.d_nb.x] = A[a0 + k * p.a_nb.x] * s;
    }
}

// SOFT_MAX, one invocation per row, of x * f.x (+ mask C when misc.y == 1, rows by i1,
// broadcast over dims 2 and 3).
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
    var m = -3.4028235e38;
    for (var k = 0u; k < p.a_ne.x; k++) {
        var x = A[a0 + k * p.a_nb.x] * p.f.x;
        if (has_mask) {
            x += C[c0 + k * p.c_nb.x];
        }
        m = max(m, x);
    }
    var sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        var x = A[a0 + k * p.a_nb.x] * p.f.x;
        if (has_mask) {
            x += C[c0 + k * p.c_nb.x];
        }
        let e = exp(x - m);
        sum += e;
        D[d0 + k * p.d_nb.x] = e;
    }
    let inv = 1.0 / sum;
    for (var k = 0u; k < p.a_ne.x; k++) {
        D[d0 + k * p.d_nb.x] *= inv;
    }
}

// MUL_MAT: D[i0, i1, i2, i3] = sum_k A[k, i0, i2 / misc.y, i3 / misc.z] * B[k, i1, i2, i3].
@compute @workgroup_size(64)
fn mul_mat(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.d_ne);
    let a0 = p.off.x + idx.x * p.a_nb.y + (idx.z / p.misc.y) * p.a_nb.z + (idx.w / p.misc.z) * p.a_nb.w;
    let b0 = p.off.y + idx.y * p.b_nb.y + idx.z * p.b_nb.z + idx.w * p.b_nb.w;
    var sum = 0.0;
    for (var k = 0u; k < p.a_ne.x; k++) {
        sum += A[a0 + k * p.a_nb.x] * B[b0 + k * p.b_nb.x];
    }
    D[p.off.w + at(idx, p.d_nb)] = sum;
}
