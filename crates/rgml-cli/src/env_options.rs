//! The environment variables of the `rgml` command line, mapped onto the backends' typed options
//! in this one place (library crates read no environment):
//!
//! - `RGML_CPU_ISA=avx2|avx512|avx512-nobf16`: the ggml build whose arithmetic the CPU kernels
//!   mirror ([`rgml_cpu::CpuOptions::isa`]); unset: the native build's.
//! - `RGML_CPU_REPACK=0|1`: offer repacked weights where they pay ([`rgml_cpu::CpuOptions::repack`],
//!   default 1).
//! - `RGML_CPU_AMX=0|1`: AMX tiles for the CPU kernels where the CPU and OS have them
//!   ([`rgml_cpu::CpuOptions::amx`], default 1; the same bits either way).
//! - `RGML_CPU_AVX512=0|1`: AVX-512 instructions for the CPU kernels where the CPU has them
//!   ([`rgml_cpu::CpuOptions::avx512`], default 1; `0` runs what an AVX2-only CPU runs, with the
//!   same bits).
//! - `RGML_CPU_DEVICES=N`: devices `CPU0` … `CPU{N-1}` beside `CPU`, N from 0 to
//!   [`rgml_cpu::MAX_EXTRA_DEVICES`] ([`rgml_cpu::CpuOptions::extra_devices`]).
//! - `RGML_WGPU_SOFT_FMA=0|1`: the integer FMA emulation on every GPU
//!   ([`rgml_wgpu::WgpuOptions::soft_fma`], default 0).
//! - `RGML_WGPU_EXACT=0|1`: fast or exact arithmetic on every GPU
//!   ([`rgml_wgpu::WgpuOptions::exact`]; unset: exact on CPU drivers such as lavapipe, fast on
//!   GPUs; a device parameter `Vulkan0:exact=0|1` overrides it).
//! - `RGML_WGPU_COOPMAT=0|1`: prompts on cooperative matrices (tensor cores) where a GPU offers
//!   them (`0` sets [`rgml_wgpu::WgpuOptions::no_coopmat`]; default 1).
//! - `RGML_WGPU_MV_ROWS=0|1|2|4`: weight rows per team of the fast arithmetic's block
//!   mat-vec (`0`: the older kernel of groups of 8 for every mat-vec;
//!   [`rgml_wgpu::WgpuOptions::mat_vec_rows`], default [`rgml_wgpu::DEFAULT_MV_ROWS`]), for
//!   measuring on a GPU.
//! - `RGML_WGPU_MV_TEAM=32|128`: invocations per row block of the block mat-vec (32: a warp per
//!   row block where subgroups are 32 wide; [`rgml_wgpu::WgpuOptions::mat_vec_team`], default
//!   [`rgml_wgpu::DEFAULT_MV_TEAM`]), for measuring on a GPU.
//! - `RGML_WGPU_FUSE_GLU=0|1`: a decode step's gate and up projections and their SwiGLU as one
//!   block mat-vec (`0` sets [`rgml_wgpu::WgpuOptions::no_glu_fusion`]; default 1), for
//!   measuring on a GPU.
//! - `RGML_WGPU_MV_DP4A=0|1`: the block mat-vec quantizes its activations to int8 and
//!   multiplies Q4_0, Q8_0, Q4_K and Q6_K weights with packed integer dots
//!   ([`rgml_wgpu::WgpuOptions::mat_vec_dp4a`], default 0), for measuring on a GPU.
//! - `RGML_WGPU_N_CB=N`: command buffers per graph of every GPU stream, 1 to 64
//!   ([`rgml_wgpu::WgpuOptions::n_cb`]; default 8; a device parameter `n_cb=N` overrides it),
//!   for measuring.
//!
//! An empty value counts as unset. Any other value is an error naming the variable and what it
//! accepts, so a typo never silently runs something else than asked.

use rgml_cpu::{CpuOptions, IsaChoice, MAX_EXTRA_DEVICES};
use rgml_wgpu::WgpuOptions;

/// Options for every backend the binary registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendOptions {
    /// The CPU registry's.
    pub cpu: CpuOptions,
    /// The wgpu registry's.
    pub wgpu: WgpuOptions,
}

/// The variable names, as documented in the README.
const ISA: &str = "RGML_CPU_ISA";
const REPACK: &str = "RGML_CPU_REPACK";
const DEVICES: &str = "RGML_CPU_DEVICES";
const AMX: &str = "RGML_CPU_AMX";
const AVX512: &str = "RGML_CPU_AVX512";
const SOFT_FMA: &str = "RGML_WGPU_SOFT_FMA";
const EXACT: &str = "RGML_WGPU_EXACT";
const COOPMAT: &str = "RGML_WGPU_COOPMAT";
const MV_ROWS: &str = "RGML_WGPU_MV_ROWS";
const N_CB: &str = "RGML_WGPU_N_CB";
const MV_DP4A: &str = "RGML_WGPU_MV_DP4A";
const MV_TEAM: &str = "RGML_WGPU_MV_TEAM";
const FUSE_GLU: &str = "RGML_WGPU_FUSE_GLU";

/// The options the process environment asks for.
pub fn from_env() -> Result<BackendOptions, String> {
    from_lookup(|name| match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(format!("{name}={}: not valid UTF-8", v.to_string_lossy()))
        }
    })
}

/// The options for the variables `lookup` gives (`Ok(None)`: unset).
fn from_lookup(
    lookup: impl Fn(&str) -> Result<Option<String>, String>,
) -> Result<BackendOptions, String> {
    // Set and not blank, trimmed.
    let get = |name: &str| -> Result<Option<String>, String> {
        Ok(lookup(name)?
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()))
    };
    let mut options = BackendOptions::default();
    if let Some(v) = get(ISA)? {
        let choice: IsaChoice = v.parse().map_err(|e| format!("{ISA}={v}: {e}"))?;
        options.cpu.isa = Some(choice);
    }
    if let Some(v) = get(REPACK)? {
        options.cpu.repack = flag(REPACK, &v)?;
    }
    if let Some(v) = get(AMX)? {
        options.cpu.amx = flag(AMX, &v)?;
    }
    if let Some(v) = get(AVX512)? {
        options.cpu.avx512 = flag(AVX512, &v)?;
    }
    if let Some(v) = get(DEVICES)? {
        options.cpu.extra_devices = v
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_EXTRA_DEVICES)
            .ok_or_else(|| {
                format!("{DEVICES}={v}: expected a number of extra CPU devices from 0 to {MAX_EXTRA_DEVICES}")
            })?;
    }
    if let Some(v) = get(SOFT_FMA)? {
        options.wgpu.soft_fma = flag(SOFT_FMA, &v)?;
    }
    if let Some(v) = get(EXACT)? {
        options.wgpu.exact = Some(flag(EXACT, &v)?);
    }
    if let Some(v) = get(COOPMAT)? {
        options.wgpu.no_coopmat = !flag(COOPMAT, &v)?;
    }
    if let Some(v) = get(MV_ROWS)? {
        let rows = v
            .parse::<u32>()
            .ok()
            .filter(|r| [0, 1, 2, 4].contains(r))
            .ok_or_else(|| format!("{MV_ROWS}={v}: expected 0, 1, 2 or 4"))?;
        options.wgpu.mat_vec_rows = Some(rows);
    }
    if let Some(v) = get(MV_DP4A)? {
        options.wgpu.mat_vec_dp4a = flag(MV_DP4A, &v)?;
    }
    if let Some(v) = get(MV_TEAM)? {
        let team = v
            .parse::<u32>()
            .ok()
            .filter(|t| [32, 128].contains(t))
            .ok_or_else(|| format!("{MV_TEAM}={v}: expected 32 or 128"))?;
        options.wgpu.mat_vec_team = Some(team);
    }
    if let Some(v) = get(FUSE_GLU)? {
        options.wgpu.no_glu_fusion = !flag(FUSE_GLU, &v)?;
    }
    if let Some(v) = get(N_CB)? {
        let n = v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| {
                format!("{N_CB}={v}: expected a number of command buffers from 1 to 64")
            })?;
        options.wgpu.n_cb = Some(n);
    }
    Ok(options)
}

/// A `0` / `1` switch.
fn flag(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("{name}={v}: expected 0 or 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<BackendOptions, String> {
        from_lookup(|name| {
            Ok(vars
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string()))
        })
    }

    #[test]
    fn unset_or_empty_is_the_default() {
        assert_eq!(with(&[]), Ok(BackendOptions::default()));
        let blank = [
            (ISA, " "),
            (REPACK, ""),
            (AMX, ""),
            (AVX512, ""),
            (DEVICES, ""),
            (SOFT_FMA, ""),
            (EXACT, ""),
            (COOPMAT, ""),
            (MV_ROWS, ""),
            (N_CB, ""),
            (MV_DP4A, ""),
            (MV_TEAM, ""),
            (FUSE_GLU, ""),
        ];
        assert_eq!(with(&blank), Ok(BackendOptions::default()));
    }

    #[test]
    fn values_map_onto_the_options() {
        let o = with(&[
            (ISA, "AVX512-nobf16"),
            (REPACK, "0"),
            (AMX, "0"),
            (AVX512, "0"),
            (DEVICES, " 3 "),
            (SOFT_FMA, "1"),
            (EXACT, "0"),
        ])
        .unwrap();
        assert_eq!(o.cpu.isa, Some(IsaChoice::Avx512NoBf16));
        assert!(!o.cpu.repack);
        assert!(!o.cpu.amx);
        assert!(!o.cpu.avx512);
        assert!(with(&[(AVX512, "1")]).unwrap().cpu.avx512);
        assert_eq!(o.cpu.extra_devices, 3);
        assert!(o.wgpu.soft_fma);
        assert_eq!(o.wgpu.exact, Some(false));
        assert_eq!(with(&[(EXACT, "1")]).unwrap().wgpu.exact, Some(true));
        assert_eq!(with(&[(MV_ROWS, "2")]).unwrap().wgpu.mat_vec_rows, Some(2));
        assert_eq!(with(&[(MV_ROWS, "0")]).unwrap().wgpu.mat_vec_rows, Some(0));
        assert_eq!(with(&[(N_CB, "2")]).unwrap().wgpu.n_cb, Some(2));
        assert!(with(&[(MV_DP4A, "1")]).unwrap().wgpu.mat_vec_dp4a);
        assert_eq!(
            with(&[(MV_TEAM, "128")]).unwrap().wgpu.mat_vec_team,
            Some(128)
        );
        assert!(with(&[(FUSE_GLU, "0")]).unwrap().wgpu.no_glu_fusion);
        assert!(!with(&[(FUSE_GLU, "1")]).unwrap().wgpu.no_glu_fusion);
        assert_eq!(with(&[(DEVICES, "64")]).unwrap().cpu.extra_devices, 64);
        assert!(with(&[(REPACK, "1")]).unwrap().cpu.repack);
        assert!(with(&[(COOPMAT, "0")]).unwrap().wgpu.no_coopmat);
        assert!(!with(&[(COOPMAT, "1")]).unwrap().wgpu.no_coopmat);
    }

    #[test]
    fn bad_values_name_the_variable_and_what_it_accepts() {
        for (var, value, accepted) in [
            (ISA, "bogus", "avx512-nobf16"),
            (REPACK, "bogus", "0 or 1"),
            (REPACK, "2", "0 or 1"),
            (AMX, "on", "0 or 1"),
            (AVX512, "no", "0 or 1"),
            (DEVICES, "abc", "from 0 to 64"),
            (DEVICES, "-1", "from 0 to 64"),
            (DEVICES, "65", "from 0 to 64"),
            (SOFT_FMA, "yes", "0 or 1"),
            (EXACT, "fast", "0 or 1"),
            (COOPMAT, "on", "0 or 1"),
            (MV_ROWS, "3", "0, 1, 2 or 4"),
            (N_CB, "0", "from 1 to 64"),
            (MV_DP4A, "yes", "0 or 1"),
            (MV_TEAM, "64", "32 or 128"),
            (FUSE_GLU, "on", "0 or 1"),
        ] {
            let e = with(&[(var, value)]).unwrap_err();
            assert!(e.starts_with(&format!("{var}={value}: ")), "{e}");
            assert!(e.contains(accepted), "{e}");
        }
    }
}
