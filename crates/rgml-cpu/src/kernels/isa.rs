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
//! The environment variable `RGML_CPU_ISA` overrides the choice: `avx2` forces the AVX2-build
//! arithmetic, `avx512` the AVX-512-build arithmetic (any other value is ignored). It is read
//! once, at the first kernel call that depends on it.

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

fn from_env(v: Option<&str>) -> Option<Isa> {
    match v?.trim().to_ascii_lowercase().as_str() {
        "avx2" => Some(Isa::Avx2),
        "avx512" | "avx-512" | "avx512f" => Some(Isa::Avx512),
        _ => None,
    }
}

/// The arithmetic to mirror (see the module docs).
#[inline]
pub(crate) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        from_env(std::env::var("RGML_CPU_ISA").ok().as_deref()).unwrap_or_else(detect)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values() {
        assert_eq!(from_env(Some("avx2")), Some(Isa::Avx2));
        assert_eq!(from_env(Some(" AVX512 ")), Some(Isa::Avx512));
        assert_eq!(from_env(Some("sse")), None);
        assert_eq!(from_env(None), None);
    }
}
