//! Floor 3 of the kernels: tile kernels, which compute many outputs of MUL_MAT per pass and
//! give each output the bits its path's pair dot (floor 2) or ggml's tile kernel gives.
//! - [`legacy`]: register tiles for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL (AVX2, AVX-512
//!   VNNI), and the matrix-vector kernels that prefetch weight rows;
//! - [`kquant`]: ggml's tiled K-quant and IQ4_XS kernel (from 8 activation rows), its integer
//!   sums on AMX tiles ([`kquant_amx`]) and in AVX-512 and AVX2 register tiles
//!   ([`kquant_avx512`], [`kquant_avx2`]);
//! - [`repack`]: the 4-row interleaved layouts of repacked weights, and [`q4_prompt`], the
//!   prompt kernel of repacked Q4_0 on AVX-512 VNNI with its activation layout, and
//!   [`repack_avx2`], the AVX2 build's matrix-vector kernel on that layout;
//! - [`float_avx2`], [`bf16`]: F32/F16/BF16 tiles (tinyBLAS, `vdpbf16ps`).

pub(crate) mod bf16;
pub(crate) mod float;
pub(crate) mod float_avx2;
pub(crate) mod kquant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kquant_amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kquant_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kquant_avx512;
pub(crate) mod legacy;
pub(crate) mod q4_prompt;
pub(crate) mod repack;
#[cfg(target_arch = "x86_64")]
pub(crate) mod repack_avx2;
