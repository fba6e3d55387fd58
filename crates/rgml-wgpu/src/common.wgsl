// What every rgml WGSL module shares: the parameter block, the source bindings and their
// readers. `kernels.wgsl` and `kernels_f16.wgsl` add the destination binding D and kernels.
//
// rgml's WGSL kernels are naive (one invocation per output element or row).
//
// Every kernel shares one bind group layout: a uniform block of shapes, strides and offsets, and
// four storage bindings (A, B, C: sources; D: destination), all `array<u32>` (f32 values are
// bitcast). Strides and offsets of 4-byte tensors (f32, i32) are in 4-byte elements; those of
// f16 and quantized tensors are in bytes. Bindings are all read_write so that one buffer may be
// bound several times in one dispatch (tensors of a graph usually share a buffer).

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
    // More kernel-specific floats (ROPE's YaRN range and magnitude).
    g: vec4<f32>,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> A: array<u32>;
@group(0) @binding(2) var<storage, read_write> B: array<u32>;
@group(0) @binding(3) var<storage, read_write> C: array<u32>;

const WG: u32 = 64u;

// SET_ROWS's destination row for source element `idx` (C holds i32 indices [ne1, k2, k3]).
fn set_rows_index(idx: vec4<u32>) -> i32 {
    return bitcast<i32>(C[p.off.z + idx.y * p.c_nb.x + (idx.z % p.c_ne.y) * p.c_nb.y + (idx.w % p.c_ne.z) * p.c_nb.z]);
}

// Source / destination element types (misc.z of the kernels that take several).
const T_F32: u32 = 0u;
const T_F16: u32 = 1u;
const T_Q4_0: u32 = 2u;
const T_Q4_1: u32 = 3u;
const T_Q8_0: u32 = 4u;

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
        default: {
            let blk = base + (k / 32u) * 34u;
            let q = a_u8(blk + 2u + k % 32u);
            let v = select(i32(q), i32(q) - 256, q >= 128u);
            return f32(v) * a_f16(blk);
        }
    }
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

