//! Internals exposed for `cargo bench` only (`benches/`); not a public API.

/// The barrier the compute threads meet at after every graph node.
pub struct Barrier(crate::barrier::SpinBarrier);

impl Barrier {
    /// A barrier for `n` threads.
    pub fn new(n: usize) -> Self {
        Barrier(crate::barrier::SpinBarrier::new(n))
    }

    /// Wait until all `n` threads have arrived.
    pub fn wait(&self) {
        self.0.wait()
    }
}

/// Int8 multiply-adds per second of `threads` threads running at once: `(AVX-512 VNNI,
/// AMX)`, each `None` where this CPU (or OS) lacks it.
pub fn int8_peak_macs(threads: usize) -> (Option<f64>, Option<f64>) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::simd::{amx, x86};
        let all = |f: fn(usize) -> Option<f64>, rounds: usize| -> Option<f64> {
            let rates: Vec<Option<f64>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads.max(1))
                    .map(|_| s.spawn(move || f(rounds)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().ok().flatten())
                    .collect()
            });
            rates.into_iter().sum()
        };
        (
            all(x86::vnni_peak_macs, 20_000_000),
            all(amx::peak_macs, 500_000),
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        (None, None)
    }
}

/// Nanoseconds per AMX `tileloadd` (1 KiB from L1), `tdpbssd` and `tilestored` on one
/// thread (`None` without AMX-INT8).
pub fn amx_op_nanos() -> Option<[f64; 3]> {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::simd::amx::op_nanos(200_000);
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Int8 multiply-adds per second of the AMX K-quant kernel on one thread (K = 2048, 256
/// weight rows of `dtype` by `ntok` activation rows); `None` without AMX.
pub fn amx_kquant_macs(dtype: rgml::DType, ntok: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::tiles::kquant_amx::bench_macs(dtype, ntok);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, ntok);
        None
    }
}

/// Int8 multiply-adds per second of the K-quant kernels other than AMX's on one thread (K =
/// 2048, 256 weight rows of `dtype` by `ntok` activation rows): the AVX-512 register tiles,
/// the AVX2 register tiles (`None` without the instructions or for IQ4_XS), and the one-row
/// kernel (AVX2 where the CPU has it; `None` for a type that is not a K-quant).
pub fn kquant_tile_macs(dtype: rgml::DType, ntok: usize) -> [Option<f64>; 3] {
    #[cfg(target_arch = "x86_64")]
    let (wide, avx2) = (
        crate::kernels::tiles::kquant_avx512::bench_macs(dtype, ntok),
        crate::kernels::tiles::kquant_avx2::bench_macs(dtype, ntok),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (wide, avx2) = (None, None);
    [
        wide,
        avx2,
        crate::kernels::tiles::kquant::bench_macs(dtype, ntok),
    ]
}

/// Int8 multiply-adds per second, 1 thread, of the repacked Q4_0 prompt kernel on its
/// prepared activations and of the repacked kernel on Q8_0 activations (K = 2048, 256
/// weight rows by `ntok` activation rows); `None` without AVX-512 VNNI.
pub fn q4_prompt_macs(ntok: usize) -> Option<[f64; 2]> {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::tiles::q4_prompt::bench_macs(ntok);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ntok;
        None
    }
}

/// MUL_MAT's one-activation-row kernel for plain weights of a type (a decode step's
/// product), run on one thread, kernel only.
pub struct Matvec {
    dtype: rgml::DType,
    kernel: crate::kernels::dots::run::MatvecKernel,
}

impl Matvec {
    /// The kernel for `dtype` on this CPU (`None` where MUL_MAT takes another path).
    pub fn new(dtype: rgml::DType) -> Option<Matvec> {
        let f = crate::CpuFeatures::detect();
        crate::kernels::matmul::matvec_path(f, dtype).map(|kernel| Matvec { dtype, kernel })
    }

    /// `out[r] = dot(row r of w, y)` for every row of `w` (rows of `ne0` values), in the
    /// row blocks MUL_MAT hands a thread. `y` is one activation row quantized by
    /// [`repack::quantize_activations`]. An error where the operands do not fit.
    pub fn run(&self, ne0: usize, w: &[u8], y: &[u8], out: &mut [f32]) -> rgml::Result<()> {
        use crate::kernels::{dots::run::RowRun, task};
        let dtype = self.dtype;
        let rb = dtype.row_bytes(ne0)?;
        let sizes_fit = rb > 0
            && w.len() == out.len() * rb
            && y.len() == dtype.vec_dot_type().row_bytes(ne0)?;
        if !sizes_fit {
            return Err(rgml::Error::Backend {
                backend: "CPU".into(),
                message: "bench matvec: operand sizes".into(),
            });
        }
        let nb = ne0 / dtype.block_size();
        for (block, o) in out.chunks_mut(task::MAX_BLOCK_ROWS).enumerate() {
            let run = RowRun {
                nb,
                x0: w[block * task::MAX_BLOCK_ROWS * rb..].as_ptr(),
                row_stride: rb,
                y: y.as_ptr(),
            };
            // SAFETY: `kernel` is this CPU's for `dtype`; checked: `o.len()` dense rows of
            // `nb` blocks from `x0` within `w`, `y` one activation row of `nb` blocks.
            unsafe { (self.kernel)(run, o) };
        }
        Ok(())
    }
}

/// Repacked (4-row interleaved) weights against the plain tiled kernels, single thread,
/// kernel only: the row and column loops MUL_MAT would run, without the graph around them.
pub mod repack {
    use crate::kernels::blocks::activations;
    use crate::kernels::tiles::{legacy as tiled, repack};
    use rgml::{DType, Error, Result};

    use crate::CpuFeatures;

    /// What the benchmarks run with: this CPU's features, native arithmetic.
    fn features() -> CpuFeatures {
        CpuFeatures::detect()
    }

    /// Whether the repacked kernels read the packed layout directly on this CPU.
    pub fn fast() -> bool {
        repack::fast(features())
    }

    /// Whether the plain tiled kernels run on this CPU for `dtype`.
    pub fn plain_supported(dtype: DType) -> bool {
        tiled::supported(features(), dtype)
    }

    /// Whether weights of `dtype` can be repacked.
    pub fn packable(dtype: DType) -> bool {
        repack::supported(dtype)
    }

    /// Interleave dense rows (see the repack module).
    pub fn pack(dtype: DType, ne0: usize, src: &[u8], dst: &mut [u8]) -> Result<()> {
        repack::pack(dtype, ne0, src, dst)
    }

    /// One activation row quantized to `dtype`'s vec-dot type, as MUL_MAT does.
    pub fn quantize_activations(dtype: DType, src: &[f32]) -> Result<Vec<u8>> {
        let vd = dtype.vec_dot_type();
        let mut b = vec![0u8; vd.row_bytes(src.len())?];
        activations::quantize_activations(features(), vd, src, &mut b)?;
        Ok(b)
    }

    /// Checks the operands of both products; returns (rows, blocks per row, row bytes).
    fn check(
        dtype: DType,
        ne0: usize,
        w: &[u8],
        cols: &[Vec<u8>],
        out: &[f32],
    ) -> Result<(usize, usize, usize)> {
        let bad = |m: &str| Error::Backend {
            backend: "CPU".into(),
            message: format!("bench repack: {m}"),
        };
        if !repack::supported(dtype) || !tiled::supported(features(), dtype) {
            return Err(bad("dtype"));
        }
        let rb = dtype.row_bytes(ne0)?;
        let yb = dtype.vec_dot_type().row_bytes(ne0)?;
        if rb == 0 || !w.len().is_multiple_of(4 * rb) {
            return Err(bad("weights are not whole 4-row groups"));
        }
        let rows = w.len() / rb;
        if cols.is_empty() || cols.len() > 8 || cols.iter().any(|c| c.len() != yb) {
            return Err(bad("columns"));
        }
        if out.len() < rows * cols.len() {
            return Err(bad("output"));
        }
        Ok((rows, ne0 / 32, rb))
    }

    /// `out[row * cols.len() + c]` for dense weights, 4 rows at a time with the tiled
    /// kernels (what MUL_MAT runs today).
    pub fn plain(
        dtype: DType,
        ne0: usize,
        w: &[u8],
        cols: &[Vec<u8>],
        out: &mut [f32],
    ) -> Result<()> {
        let (rows, nb, rb) = check(dtype, ne0, w, cols, out)?;
        let y: Vec<*const u8> = cols.iter().map(|c| c.as_ptr()).collect();
        let n = cols.len();
        let f = features();
        for g in 0..rows / 4 {
            let x: [*const u8; 4] = std::array::from_fn(|r| w[(4 * g + r) * rb..].as_ptr());
            // SAFETY: checked: tiled::supported, 4 dense rows of `nb` blocks, columns of
            // `nb` activation blocks, `out` holds this group's 4 rows of `n` values.
            unsafe { tiled::tile(f, dtype, nb, &x, &y, &mut out[4 * g * n..], n) };
        }
        Ok(())
    }

    /// As [`plain`], on weights packed by [`pack`], with the repacked kernels.
    pub fn repacked(
        dtype: DType,
        ne0: usize,
        w: &[u8],
        cols: &[Vec<u8>],
        out: &mut [f32],
        scratch: &mut [u8],
    ) -> Result<()> {
        let (rows, nb, rb) = check(dtype, ne0, w, cols, out)?;
        let y: Vec<*const u8> = cols.iter().map(|c| c.as_ptr()).collect();
        let n = cols.len();
        for g in 0..rows / 4 {
            let group = w[4 * g * rb..].as_ptr();
            // SAFETY: checked: a whole packed group of `nb` blocks per row, columns of
            // `nb` activation blocks, `out` holds this group's 4 rows of `n` values.
            unsafe {
                repack::tile(
                    features(),
                    dtype,
                    nb,
                    group,
                    &y,
                    &mut out[4 * g * n..],
                    n,
                    scratch,
                )
            };
        }
        Ok(())
    }

    /// As [`repacked`], all groups in one `tile_groups` call (four groups per kernel call
    /// for mat-vec, else two groups by up to 4 columns).
    pub fn repacked_groups(
        dtype: DType,
        ne0: usize,
        w: &[u8],
        cols: &[Vec<u8>],
        out: &mut [f32],
        scratch: &mut [u8],
    ) -> Result<()> {
        let (rows, nb, _) = check(dtype, ne0, w, cols, out)?;
        let y: Vec<*const u8> = cols.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: checked: `rows / 4` whole packed groups of `nb` blocks per row, columns
        // of `nb` activation blocks, `out` holds every row's `cols.len()` values.
        unsafe {
            repack::tile_groups(
                features(),
                dtype,
                nb,
                w.as_ptr(),
                rows / 4,
                &y,
                out,
                cols.len(),
                scratch,
            )
        };
        Ok(())
    }
}
