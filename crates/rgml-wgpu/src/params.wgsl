// The parameter block every rgml WGSL module reads (binding 0) and the element type codes.
// Every module is prefixed with this file; `common.wgsl` adds the source bindings of the
// kernels that read their sources as 4-byte words, `kernels_mv.wgsl` its own.

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
    // More kernel-specific floats (ROPE's YaRN correction dims).
    g: vec4<f32>,
}

@group(0) @binding(0) var<uniform> p: P;
// Source / destination element types (misc.z of the kernels that take several).
const T_F32: u32 = 0u;
const T_F16: u32 = 1u;
const T_Q4_0: u32 = 2u;
const T_Q4_1: u32 = 3u;
const T_Q8_0: u32 = 4u;
const T_Q4_K: u32 = 5u;
const T_Q6_K: u32 = 6u;
// Read only by the fast kernels (`kernels_fast.wgsl`).
const T_BF16: u32 = 7u;
const T_Q5_0: u32 = 8u;
const T_Q5_1: u32 = 9u;
const T_Q2_K: u32 = 10u;
const T_Q3_K: u32 = 11u;
const T_Q5_K: u32 = 12u;
const T_IQ4_NL: u32 = 13u;
const T_IQ4_XS: u32 = 14u;
const T_MXFP4: u32 = 15u;

