// Integer-to-float conversions the fast kernels share (prefixed to `kernels_fast.wgsl` and
// `kernels_mv.wgsl`). Small unsigned integers (below 2^23) become f32 without conversion
// instructions, which run at a quarter or less of the float rate on NVIDIA GPUs while a
// matrix product converts every weight: `v | 0x4b000000` is the float 2^23 + v, so
// subtracting 2^23 leaves v exactly.
//
// Combine integers before converting them, never two converted values: NVIDIA's compiler
// reassociates `u4f(a) - 4.0 * u4f(b)` into `(2^23 + a) - 4 (2^23 + b) + 3 x 2^23`, where the
// middle sum (about 2^24.6) rounds odd values away. Q3_K's decoder did that, and its fast
// products were off by about 10% (NMSE 0.1) on an H200 while lavapipe computed them exactly.

fn u4f(v: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

fn u1f(v: u32) -> f32 {
    return bitcast<f32>(v | 0x4b000000u) - 8388608.0;
}

// The four bytes of `w` (each 0..255) as f32.
fn u8x4(w: u32) -> vec4<f32> {
    return u4f(vec4<u32>(w & 0xffu, (w >> 8u) & 0xffu, (w >> 16u) & 0xffu, w >> 24u));
}
