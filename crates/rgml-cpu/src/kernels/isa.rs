//! Which ggml-cpu build's arithmetic the kernels mirror, and which instructions they may use:
//! [`CpuFeatures`], a small `Copy` value resolved once per device (or per backend) and handed
//! to every kernel with its node. This module owns that value: the one place that asks the CPU
//! what it has ([`CpuFeatures::detect`]; the kernels' `#[target_feature]` attributes aside),
//! the typed choice that overrides the arithmetic ([`IsaChoice`]), and the rules that combine
//! the two.
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
//! FMAs of a build without it. [`CpuFeatures::bf16_products`] says whether we mirror that
//! build: the AVX-512 arithmetic is selected and the CPU has AVX512_BF16 (with F, BW and VL).
//! No software emulation stands in for the instruction, so without it BF16 weights keep the
//! AVX-512 (or AVX2) build's f32 arithmetic, which is also what a native build on such a CPU
//! computes.
//!
//! Half-precision vectors: a native build on a CPU with AVX512-FP16 (Sapphire Rapids and later
//! Intel CPUs; not AMD's Zen 4 or 5) has `__AVX512FP16__`, and then `vec_mad_f16` and
//! `vec_scale_f16` (flash attention's f16 accumulator) compute in f16 with one rounding per
//! operation, the f32 weight first rounded to f16, where a build without it computes in f32 and
//! rounds the result. [`CpuFeatures::f16_vectors`] says whether we mirror that build: the
//! AVX-512 arithmetic is selected (not `avx512-nobf16`, which stands for the builds of older
//! AVX-512 CPUs) and the CPU has AVX512-FP16.
//!
//! # Forcing the arithmetic
//! An [`IsaChoice`] overrides the detected variant: `avx2` the AVX2-build arithmetic, `avx512`
//! the AVX-512-build arithmetic (with `vdpbf16ps` for BF16 weights if the CPU has it),
//! `avx512-nobf16` the AVX-512-build arithmetic without it (a build for an AVX-512 CPU without
//! AVX512_BF16; for comparisons on CPUs that have it). It is given as a typed option: the
//! backend parameter `isa=` (`CPU:isa=avx512`), or device-wide with [`crate::CpuOptions`]. This
//! crate reads no environment variable; the `rgml` command line maps `RGML_CPU_ISA` onto the
//! device option.
//!
//! A choice changes only the arithmetic mirrored, never the instructions: the hardware flags
//! stay the detected ones, so forcing the AVX-512 arithmetic on an AVX2 CPU runs the portable
//! transcriptions, and no instruction the CPU lacks is ever executed. Kernels may therefore
//! rely on a `has_*` flag of the value they are handed before entering a `#[target_feature]`
//! function; the fields are private so no safe code can claim a feature the CPU lacks.

use std::fmt;
use std::str::FromStr;

/// The ggml-cpu build whose arithmetic the kernels reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// A build with `__AVX2__` and `__FMA__` (8 float lanes).
    Avx2,
    /// A build with `__AVX512F__`, `__AVX512DQ__` and friends (16 float lanes).
    Avx512,
}

/// A forced choice of arithmetic (see the module docs); `None` where one is optional means
/// "as a native build on this CPU".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IsaChoice {
    /// `avx2`: the AVX2 build.
    Avx2,
    /// `avx512`: the AVX-512 build, with `vdpbf16ps` for BF16 weights where the CPU has it.
    Avx512,
    /// `avx512-nobf16`: the AVX-512 build without AVX512_BF16.
    Avx512NoBf16,
}

impl IsaChoice {
    /// The accepted spellings, one per choice, as [`IsaChoice::name`] gives them.
    pub const NAMES: [&'static str; 3] = ["avx2", "avx512", "avx512-nobf16"];

    /// The canonical name (`avx2`, `avx512`, `avx512-nobf16`).
    pub fn name(self) -> &'static str {
        match self {
            IsaChoice::Avx2 => "avx2",
            IsaChoice::Avx512 => "avx512",
            IsaChoice::Avx512NoBf16 => "avx512-nobf16",
        }
    }
}

impl fmt::Display for IsaChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no [`IsaChoice`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown CPU ISA '{value}' (accepted: avx2, avx512, avx512-nobf16)")]
pub struct ParseIsaError {
    /// The rejected text.
    pub value: String,
}

impl FromStr for IsaChoice {
    type Err = ParseIsaError;

    /// The canonical names, case-insensitive and trimmed; `avx-512` / `avx512f` are accepted
    /// for `avx512` and `avx-512-nobf16` for `avx512-nobf16`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "avx2" => Ok(IsaChoice::Avx2),
            "avx512" | "avx-512" | "avx512f" => Ok(IsaChoice::Avx512),
            "avx512-nobf16" | "avx-512-nobf16" => Ok(IsaChoice::Avx512NoBf16),
            _ => Err(ParseIsaError {
                value: s.to_string(),
            }),
        }
    }
}

/// What the kernels may use and which arithmetic they mirror (see the module docs): the CPU's
/// SIMD features as detected, the ggml build mirrored ([`Isa`]) and whether BF16 weights take
/// the `vdpbf16ps` path. Made by [`CpuFeatures::detect`] or [`CpuFeatures::resolve`] only, so
/// every `has_*` flag is true only where the CPU has the feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuFeatures {
    /// AVX2, FMA and F16C.
    avx2: bool,
    /// AVX-512 F, DQ, BW and VL (and everything `avx2` covers).
    avx512: bool,
    /// AVX-512 VNNI (and everything `avx512` covers).
    avx512_vnni: bool,
    /// AVX512_BF16 (and everything `avx512` covers).
    avx512_bf16: bool,
    /// AMX-TILE and AMX-INT8, usable by this process (and everything `avx512` covers).
    amx_int8: bool,
    /// AVX512-FP16 (and everything `avx512` covers).
    avx512_fp16: bool,
    /// The arithmetic mirrored.
    isa: Isa,
    /// BF16 weights through `vdpbf16ps`: implies `isa == Avx512` and `avx512_bf16`.
    bf16_products: bool,
    /// ggml's f16 vector ops in half precision: implies `isa == Avx512` and `avx512_fp16`.
    f16_vectors: bool,
}

impl CpuFeatures {
    /// This CPU's features and the arithmetic of a native ggml build on it. The only place
    /// that detects CPU features (std caches the answer, so calling it again is cheap).
    pub fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        let (avx2, avx512, avx512_vnni, avx512_bf16, avx512_fp16) = {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 =
                avx2 && has!("avx512f") && has!("avx512dq") && has!("avx512bw") && has!("avx512vl");
            (
                avx2,
                avx512,
                avx512 && has!("avx512vnni"),
                avx512 && has!("avx512bf16"),
                avx512 && has!("avx512fp16"),
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, avx512, avx512_vnni, avx512_bf16, avx512_fp16) =
            (false, false, false, false, false);
        #[cfg(target_arch = "x86_64")]
        let amx_int8 = avx512 && super::simd::amx::usable();
        #[cfg(not(target_arch = "x86_64"))]
        let amx_int8 = false;
        CpuFeatures {
            avx2,
            avx512,
            avx512_vnni,
            avx512_bf16,
            amx_int8,
            avx512_fp16,
            isa: Isa::Avx2,
            bf16_products: false,
            f16_vectors: false,
        }
        .with_choice(None)
    }

    /// [`CpuFeatures::detect`] with the arithmetic `choice` (`None`: the native build's).
    pub fn resolve(choice: Option<IsaChoice>) -> CpuFeatures {
        CpuFeatures::detect().with_choice(choice)
    }

    /// The same hardware with the arithmetic `choice` (`None`: the native build's). Never
    /// enables an instruction path: only [`CpuFeatures::isa`] and
    /// [`CpuFeatures::bf16_products`] and [`CpuFeatures::f16_vectors`] change.
    pub fn with_choice(self, choice: Option<IsaChoice>) -> CpuFeatures {
        let (isa, allow_bf16) = match choice {
            None if self.avx512 => (Isa::Avx512, true),
            None | Some(IsaChoice::Avx2) => (Isa::Avx2, false),
            Some(IsaChoice::Avx512) => (Isa::Avx512, true),
            Some(IsaChoice::Avx512NoBf16) => (Isa::Avx512, false),
        };
        // `avx512-nobf16` stands for an older AVX-512 CPU's build: without FP16 either.
        let newer = isa == Isa::Avx512 && allow_bf16;
        CpuFeatures {
            isa,
            bf16_products: newer && self.avx512_bf16,
            f16_vectors: newer && self.avx512_fp16,
            ..self
        }
    }

    /// The ggml build whose arithmetic the kernels mirror.
    #[inline]
    pub fn isa(self) -> Isa {
        self.isa
    }

    /// Whether BF16 weights are multiplied with `vdpbf16ps`, as a native build with
    /// `__AVX512BF16__` does: the AVX-512 arithmetic is selected (not `avx512-nobf16`) and the
    /// CPU has AVX512_BF16, F, BW and VL. Kernels that use the instruction may rely on those
    /// features when this is true.
    #[inline]
    pub fn bf16_products(self) -> bool {
        self.bf16_products
    }

    /// Whether ggml's f16 vector ops (`vec_mad_f16`, `vec_scale_f16`) compute in half
    /// precision, as a native build with `__AVX512FP16__` does: the AVX-512 arithmetic is
    /// selected (not `avx512-nobf16`) and the CPU has AVX512-FP16. Kernels that use the
    /// instructions may rely on AVX512-FP16, F and BW when this is true.
    #[inline]
    pub fn f16_vectors(self) -> bool {
        self.f16_vectors
    }

    /// The same arithmetic with no SIMD instructions: every kernel takes its portable path
    /// (for the tests that compare it with the SIMD one; dropping features is always safe).
    #[cfg(test)]
    pub(crate) fn without_simd(self) -> CpuFeatures {
        CpuFeatures {
            avx2: false,
            avx512: false,
            avx512_vnni: false,
            avx512_bf16: false,
            amx_int8: false,
            avx512_fp16: false,
            bf16_products: false,
            f16_vectors: false,
            ..self
        }
    }

    /// The same CPU without its AVX-512 instructions (and AMX), as an AVX2-only CPU runs the
    /// same arithmetic: the AVX2 kernels, for tests and benchmarks of that path on an AVX-512
    /// CPU (dropping features is always safe). The AVX-512 arithmetic, if selected, is then
    /// emulated as on an AVX2-only CPU.
    pub fn without_avx512(self) -> CpuFeatures {
        CpuFeatures {
            avx512: false,
            avx512_vnni: false,
            avx512_bf16: false,
            amx_int8: false,
            avx512_fp16: false,
            bf16_products: false,
            f16_vectors: false,
            ..self
        }
    }

    /// An AVX2-only CPU with the AVX2 arithmetic (for the tests of the AVX2-only kernels on any
    /// x86 CPU).
    #[cfg(test)]
    pub(crate) fn avx2_only(self) -> CpuFeatures {
        self.without_avx512().with_choice(Some(IsaChoice::Avx2))
    }

    /// The CPU has AVX2, FMA and F16C.
    #[inline]
    pub fn has_avx2(self) -> bool {
        self.avx2
    }

    /// The CPU has AVX-512 F, DQ, BW and VL (and AVX2, FMA, F16C).
    #[inline]
    pub fn has_avx512(self) -> bool {
        self.avx512
    }

    /// The CPU has AVX-512 VNNI besides [`CpuFeatures::has_avx512`]'s features.
    #[inline]
    pub fn has_avx512_vnni(self) -> bool {
        self.avx512_vnni
    }

    /// The CPU has AVX512_BF16 besides [`CpuFeatures::has_avx512`]'s features.
    #[inline]
    pub fn has_avx512_bf16(self) -> bool {
        self.avx512_bf16
    }

    /// The CPU has AMX-TILE and AMX-INT8 besides [`CpuFeatures::has_avx512`]'s features, and
    /// this process may use them (Linux granted the tile state).
    #[inline]
    pub fn has_amx_int8(self) -> bool {
        self.amx_int8
    }

    /// The same CPU without AMX: the tile kernels' AVX-512 and AVX2 fallbacks (dropping
    /// features is always safe).
    pub(crate) fn without_amx(self) -> CpuFeatures {
        CpuFeatures {
            amx_int8: false,
            ..self
        }
    }

    /// AMX as [`CpuFeatures::detect`] finds it, where this value has AVX-512 (never enables AMX
    /// the CPU or OS lacks).
    pub(crate) fn with_amx_as_detected(self) -> CpuFeatures {
        CpuFeatures {
            amx_int8: self.avx512 && CpuFeatures::detect().amx_int8,
            ..self
        }
    }

    /// The AVX-512 arithmetic is mirrored (16 float lanes).
    #[inline]
    pub(crate) fn wide(self) -> bool {
        self.isa == Isa::Avx512
    }
}

impl fmt::Display for CpuFeatures {
    /// E.g. `avx512 arithmetic (cpu: avx2 avx512 vnni bf16; bf16 products)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let isa = match self.isa {
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        };
        write!(f, "{isa} arithmetic (cpu:")?;
        let flags = [
            (self.avx2, " avx2"),
            (self.avx512, " avx512"),
            (self.avx512_vnni, " vnni"),
            (self.avx512_bf16, " bf16"),
            (self.amx_int8, " amx"),
            (self.avx512_fp16, " fp16"),
        ];
        let mut any = false;
        for (on, name) in flags {
            if on {
                f.write_str(name)?;
                any = true;
            }
        }
        if !any {
            f.write_str(" portable")?;
        }
        if self.bf16_products {
            f.write_str("; bf16 products")?;
        }
        if self.f16_vectors {
            f.write_str("; f16 vectors")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!("avx2".parse(), Ok(IsaChoice::Avx2));
        assert_eq!(" AVX512 ".parse(), Ok(IsaChoice::Avx512));
        assert_eq!("avx-512".parse(), Ok(IsaChoice::Avx512));
        assert_eq!("avx512-nobf16".parse(), Ok(IsaChoice::Avx512NoBf16));
        for bad in ["sse", "", "avx512 bf16", "bogus"] {
            let e = bad.parse::<IsaChoice>().unwrap_err();
            assert_eq!(e.value, bad);
            assert!(e.to_string().contains("avx512-nobf16"), "{e}");
        }
        for name in IsaChoice::NAMES {
            assert_eq!(name.parse::<IsaChoice>().map(IsaChoice::name), Ok(name));
        }
    }

    /// A choice sets the arithmetic and never a hardware flag; the bf16 path needs both the
    /// AVX-512 arithmetic and the instruction.
    #[test]
    fn choices_keep_the_hardware() {
        let hw = CpuFeatures::detect();
        let same_hw = |f: CpuFeatures| {
            (
                f.has_avx2(),
                f.has_avx512(),
                f.has_avx512_vnni(),
                f.has_avx512_bf16(),
            ) == (
                hw.has_avx2(),
                hw.has_avx512(),
                hw.has_avx512_vnni(),
                hw.has_avx512_bf16(),
            )
        };
        let native = if hw.has_avx512() {
            Isa::Avx512
        } else {
            Isa::Avx2
        };
        assert_eq!(hw.isa(), native);
        assert_eq!(
            hw.bf16_products(),
            native == Isa::Avx512 && hw.has_avx512_bf16()
        );

        let avx2 = hw.with_choice(Some(IsaChoice::Avx2));
        assert!(same_hw(avx2));
        assert_eq!((avx2.isa(), avx2.bf16_products()), (Isa::Avx2, false));

        let avx512 = hw.with_choice(Some(IsaChoice::Avx512));
        assert!(same_hw(avx512));
        assert_eq!(avx512.isa(), Isa::Avx512);
        assert_eq!(avx512.bf16_products(), hw.has_avx512_bf16());

        let nobf16 = avx512.with_choice(Some(IsaChoice::Avx512NoBf16));
        assert!(same_hw(nobf16));
        assert_eq!((nobf16.isa(), nobf16.bf16_products()), (Isa::Avx512, false));

        assert_eq!(nobf16.with_choice(None), hw);
        assert_eq!(CpuFeatures::resolve(Some(IsaChoice::Avx2)), avx2);
        assert!(hw.to_string().contains("arithmetic"));
    }
}
