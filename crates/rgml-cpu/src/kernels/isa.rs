//! Which ggml-cpu build's arithmetic the kernels mirror.
//!
//! ggml-cpu's results depend on the SIMD width it was compiled for: an AVX-512 build sums dot
//! products in 16 lanes (tinyBLAS `KN = 16`, `_mm512_reduce_add_ps`), computes `exp` with the
//! `__m512` `ggml_v_expf` (which scales by `2^n` with `vscalefps`) on groups of 16, and so on,
//! while an AVX2 build does the same in groups of 8 with a different instruction sequence. We
//! mirror the arithmetic of a native ggml-cpu build on the same CPU: the AVX-512 variant when the
//! CPU has AVX-512 F/DQ/BW/VL (what `-march=native` enables on such a CPU), the AVX2 variant
//! otherwise. Both variants are plain Rust that reproduces the bits of the intrinsics, so either
//! one runs (more slowly) on any CPU.
//!
//! BF16 weights: a native build on a CPU with AVX512_BF16 (Cooper Lake, Sapphire Rapids and
//! later, Zen 4) has `__AVX512BF16__`, and then multiplies BF16 weights by activations rounded
//! to bf16 with `vdpbf16ps` (tinyBLAS `KN = 32` tiles for prompts, `ggml_vec_dot_bf16`'s
//! two-accumulator loop otherwise), whose products and sums round differently from the f32
//! FMAs of a build without it. [`avx512_bf16`] says whether we mirror that build: the AVX-512
//! arithmetic is selected and the CPU has AVX512_BF16 (with F, BW and VL). No software
//! emulation stands in for the instruction, so without it BF16 weights keep the AVX-512 (or
//! AVX2) build's f32 arithmetic, which is also what a native build on such a CPU computes.
//!
//! The environment variable `RGML_CPU_ISA` overrides the choice: `avx2` forces the AVX2-build
//! arithmetic, `avx512` the AVX-512-build arithmetic (with `vdpbf16ps` for BF16 weights if the
//! CPU has it), `avx512-nobf16` the AVX-512-build arithmetic without it (a build for an AVX-512
//! CPU without AVX512_BF16; for comparisons on CPUs that have it); any other value is ignored.
//! It is read once, at the first kernel call that depends on it.

use std::sync::OnceLock;

/// The ggml-cpu build whose arithmetic the kernels reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// A build with `__AVX2__` and `__FMA__` (8 float lanes).
    Avx2,
    /// A build with `__AVX512F__`, `__AVX512DQ__` and friends (16 float lanes).
    Avx512,
}

fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512dq") && has!("avx512bw") && has!("avx512vl") {
            return Isa::Avx512;
        }
    }
    Isa::Avx2
}

/// The build `RGML_CPU_ISA` asks for, and whether it allows `vdpbf16ps` (`None`: detect).
fn from_env(v: Option<&str>) -> Option<(Isa, bool)> {
    match v?.trim().to_ascii_lowercase().as_str() {
        "avx2" => Some((Isa::Avx2, false)),
        "avx512" | "avx-512" | "avx512f" => Some((Isa::Avx512, true)),
        "avx512-nobf16" | "avx-512-nobf16" => Some((Isa::Avx512, false)),
        _ => None,
    }
}

/// `RGML_CPU_ISA`, read once.
fn env_choice() -> Option<(Isa, bool)> {
    static CHOICE: OnceLock<Option<(Isa, bool)>> = OnceLock::new();
    *CHOICE.get_or_init(|| from_env(std::env::var("RGML_CPU_ISA").ok().as_deref()))
}

/// The arithmetic to mirror (see the module docs).
#[inline]
pub(crate) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| env_choice().map_or_else(detect, |(isa, _)| isa))
}

/// Whether BF16 weights are multiplied with `vdpbf16ps`, as a native build with
/// `__AVX512BF16__` does (see the module docs): the AVX-512 arithmetic is selected, not
/// `avx512-nobf16`, and the CPU has AVX512_BF16, F, BW and VL. Kernels that use the
/// instruction may rely on those features when this is true.
#[inline]
pub(crate) fn avx512_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        isa() == Isa::Avx512 && env_choice().is_none_or(|(_, bf16)| bf16) && bf16_hardware()
    })
}

/// Whether the CPU has AVX512_BF16 and the AVX-512 subsets the BF16 kernels use beside it.
pub(crate) fn bf16_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512bf16") && has!("avx512f") && has!("avx512bw") && has!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values() {
        assert_eq!(from_env(Some("avx2")), Some((Isa::Avx2, false)));
        assert_eq!(from_env(Some(" AVX512 ")), Some((Isa::Avx512, true)));
        assert_eq!(from_env(Some("avx512-nobf16")), Some((Isa::Avx512, false)));
        assert_eq!(from_env(Some("sse")), None);
        assert_eq!(from_env(None), None);
    }
}
