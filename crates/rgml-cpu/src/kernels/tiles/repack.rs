//! Repacked weights: Q4_0, Q4_1 and Q8_0 matrices stored with every 4 rows interleaved block
//! by block ("x4"), and the kernels that multiply such a 4-row group by quantized activation
//! rows.
//!
//! This module owns the layout (packing, unpacking, single-row extraction) and the products:
//! [`tile`] (one group by up to 8 columns) and [`tile_groups`] (consecutive groups, with
//! kernels that take several groups per call). Wiring them into buffers, MUL_MAT and GET_ROWS
//! is done elsewhere.
//!
//! Direct kernels (AVX-512 VNNI, see [`fast`]) exist for all three dtypes; the AVX2 build has
//! its matrix-vector kernel ([`super::repack_avx2`]) and reads packed rows in its column
//! kernel for prompts ([`row_view`]); elsewhere the products unpack each group into scratch
//! and run the tiled or per-pair dots.
//!
//! # Layout
//! Rows are taken 4 at a time (group `g` = rows `4g..4g + 4`, stored at
//! `[g * 4 * row_bytes, (g + 1) * 4 * row_bytes)`, so a repacked tensor has its original size).
//! Inside a group, for each block index `k` in order, one packed block holds the 4 rows' block
//! `k`: first each f16 field of the block for rows 0..4 (`d[4]`, then `m[4]` for Q4_1), then the
//! rows' quants one after the other (`qs[4][16]` for Q4, `qs[4][32]` for Q8_0), bytes copied
//! unchanged. Packed blocks are 72 (Q4_0), 80 (Q4_1) and 136 (Q8_0) bytes.
//!
//! # Exactness
//! [`tile`] gives, bit for bit, what [`crate::kernels::dots::vec_dot`] gives on the unpacked
//! rows (ggml's AVX2 per-pair dots): each pair's 8 f32 lanes receive per block the same exact
//! integer sums of 4 byte products, the same scale product `d_x * d_y` and the same FMA; Q4_1's
//! min terms are multiplied then added in block order; the final horizontal sum associates as
//! `hsum_float_8`. Only the positions of lanes inside registers differ, and lanes never mix
//! before the final sum. The integer sums are computed differently (unsigned x signed
//! `vpdpbusd` plus an exact correction), which cannot change an exact integer.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use rgml::{DType, Error, Result};

use crate::kernels::dots;
#[cfg(target_arch = "x86_64")]
use crate::kernels::fp16::h2f;
use crate::kernels::isa::CpuFeatures;
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::x86::{cvtph4_ps, hsum8x4_ps};
use crate::kernels::simd::x86::{halves, hsum8};
use crate::kernels::tiles::legacy;

/// Whether the AVX2 build's matrix-vector kernel for packed groups runs on the CPU `f`
/// describes ([`super::repack_avx2`]).
pub(crate) fn avx2_matvec(f: CpuFeatures) -> bool {
    legacy::build(f) == Some(legacy::TiledIsa::Avx2)
}

/// Rows per interleaved group.
pub(crate) const GROUP_ROWS: usize = 4;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(super::repack_avx2::ROWS == GROUP_ROWS);

/// The most activation columns one fast kernel call takes (more are split).
const MAX_COLS: usize = 8;

/// Whether weights of `dtype` can be repacked: Q4_0, Q4_1 and Q8_0.
pub(crate) fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Whether the direct kernels (which read the packed layout without unpacking) run on the CPU
/// `f` describes: AVX-512 F/BW/DQ/VL with VNNI, and the kernels mirror an AVX-512 ggml build
/// ([`CpuFeatures::isa`]). Otherwise [`tile`] unpacks each group into scratch first.
pub(crate) fn fast(f: CpuFeatures) -> bool {
    legacy::build(f) == Some(legacy::TiledIsa::Avx512Vnni) && f.wide()
}

/// Per-dtype geometry of a ggml block: bytes, number of leading f16 fields, quant bytes.
#[derive(Clone, Copy)]
struct Geom {
    /// Bytes of one ggml block (also of one row's share of a packed block).
    block: usize,
    /// Leading f16 fields (`d`, and `m` for Q4_1).
    fields: usize,
    /// Quant bytes of one block.
    qs: usize,
}

fn geom(dtype: DType) -> Result<Geom> {
    match dtype {
        DType::Q4_0 => Ok(Geom {
            block: 18,
            fields: 1,
            qs: 16,
        }),
        DType::Q4_1 => Ok(Geom {
            block: 20,
            fields: 2,
            qs: 16,
        }),
        DType::Q8_0 => Ok(Geom {
            block: 34,
            fields: 1,
            qs: 32,
        }),
        other => Err(Error::Unsupported {
            backend: "CPU".into(),
            what: format!("repacked layout for {other}"),
        }),
    }
}

fn bad_size(what: String) -> Error {
    Error::Backend {
        backend: "CPU".into(),
        message: format!("repack: {what}"),
    }
}

/// Geometry and bytes of one row, after checking the row length.
fn row_geom(dtype: DType, ne0: usize) -> Result<(Geom, usize)> {
    let g = geom(dtype)?;
    if ne0 == 0 || !ne0.is_multiple_of(32) {
        return Err(Error::BlockMisaligned {
            dtype,
            n: ne0,
            block: 32,
        });
    }
    Ok((g, ne0 / 32 * g.block))
}

/// Checks shared by [`pack`] and [`unpack`]: same lengths, whole groups.
fn group_geom(dtype: DType, ne0: usize, src: usize, dst: usize) -> Result<(Geom, usize)> {
    let (g, row_bytes) = row_geom(dtype, ne0)?;
    if src != dst {
        return Err(bad_size(format!(
            "source of {src} bytes, destination of {dst}"
        )));
    }
    if !src.is_multiple_of(GROUP_ROWS * row_bytes) {
        return Err(bad_size(format!(
            "{src} bytes are not whole groups of {GROUP_ROWS} rows of {row_bytes} bytes"
        )));
    }
    Ok((g, row_bytes))
}

/// Byte offset, inside a group of `nb`-block rows, of row `r`'s block `k` field `f` (f16) and
/// of its quants: the map from the dense layout to the packed one.
#[inline]
fn packed_offsets(g: Geom, k: usize, r: usize) -> (usize, usize) {
    let base = k * GROUP_ROWS * g.block;
    let fields = base + 2 * r;
    let qs = base + GROUP_ROWS * 2 * g.fields + r * g.qs;
    (fields, qs)
}

/// Row `r` (< 4) of the packed group at `group` as the AVX2 column kernels read it
/// ([`legacy::ColsKernel`]): its fields and quants spread over the group's packed blocks.
/// `None` for a dtype that is not [`supported`].
pub(crate) fn row_view(dtype: DType, group: *const u8, r: usize) -> Option<legacy::WeightRow> {
    let g = geom(dtype).ok()?;
    let (d, q) = packed_offsets(g, 0, r);
    Some(legacy::WeightRow {
        d: group.wrapping_add(d),
        stride: GROUP_ROWS * g.block,
        // Q4_1's `m[4]` follows the group's `d[4]`.
        m_off: 2 * GROUP_ROWS,
        q_off: q - d,
    })
}

/// Interleave `src` (dense rows of `dtype`, `ne0` elements each; a whole number of 4-row
/// groups) into `dst` (the same size) in the layout of the module docs.
///
/// Errors: `dtype` not [`supported`], `ne0` not a positive multiple of 32, lengths that differ
/// or are not whole groups.
pub(crate) fn pack(dtype: DType, ne0: usize, src: &[u8], dst: &mut [u8]) -> Result<()> {
    let (g, row_bytes) = group_geom(dtype, ne0, src.len(), dst.len())?;
    let nb = ne0 / 32;
    let gb = GROUP_ROWS * row_bytes;
    for (sg, dg) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
        for (r, row) in sg.chunks_exact(row_bytes).enumerate() {
            for k in 0..nb {
                let (fo, qo) = packed_offsets(g, k, r);
                let b = &row[k * g.block..(k + 1) * g.block];
                for f in 0..g.fields {
                    let at = fo + f * 2 * GROUP_ROWS;
                    dg[at..at + 2].copy_from_slice(&b[2 * f..2 * f + 2]);
                }
                dg[qo..qo + g.qs].copy_from_slice(&b[2 * g.fields..]);
            }
        }
    }
    Ok(())
}

/// The inverse of [`pack`]: `src` (packed) back to dense rows in `dst`. Any byte range of a
/// packed tensor that starts at a group boundary and covers whole groups can be unpacked on
/// its own (groups are independent).
///
/// Errors: as [`pack`].
pub(crate) fn unpack(dtype: DType, ne0: usize, src: &[u8], dst: &mut [u8]) -> Result<()> {
    let (g, row_bytes) = group_geom(dtype, ne0, src.len(), dst.len())?;
    let nb = ne0 / 32;
    let gb = GROUP_ROWS * row_bytes;
    for (sg, dg) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
        for (r, row) in dg.chunks_exact_mut(row_bytes).enumerate() {
            unpack_row_into(g, nb, sg, r, row);
        }
    }
    Ok(())
}

/// Row `r` of a checked packed group into a checked dense row.
fn unpack_row_into(g: Geom, nb: usize, group: &[u8], r: usize, row: &mut [u8]) {
    for k in 0..nb {
        let (fo, qo) = packed_offsets(g, k, r);
        let b = &mut row[k * g.block..(k + 1) * g.block];
        for f in 0..g.fields {
            let at = fo + f * 2 * GROUP_ROWS;
            b[2 * f..2 * f + 2].copy_from_slice(&group[at..at + 2]);
        }
        b[2 * g.fields..].copy_from_slice(&group[qo..qo + g.qs]);
    }
}

/// Row `r` (0..4) of one packed `group` (at least `4 * row_bytes` bytes; the first group of
/// the slice is used) unpacked into the first `row_bytes` bytes of `dst`: GET_ROWS on
/// repacked weights.
///
/// Errors: as [`pack`], `r >= 4`, or slices too short.
// GET_ROWS on repacked weights is wired up separately; until then only the tests call this.
pub(crate) fn unpack_row(
    dtype: DType,
    ne0: usize,
    group: &[u8],
    r: usize,
    dst: &mut [u8],
) -> Result<()> {
    let (g, row_bytes) = row_geom(dtype, ne0)?;
    if r >= GROUP_ROWS {
        return Err(bad_size(format!("row {r} of a {GROUP_ROWS}-row group")));
    }
    let dlen = dst.len();
    let (Some(group), Some(row)) = (
        group.get(..GROUP_ROWS * row_bytes),
        dst.get_mut(..row_bytes),
    ) else {
        return Err(bad_size(format!(
            "group of {} bytes or row of {dlen} for rows of {row_bytes} bytes",
            group.len()
        )));
    };
    unpack_row_into(g, ne0 / 32, group, r, row);
    Ok(())
}

/// `out[r * out_stride + c]` = `vec_dot(dtype, 32 * nb, row r of the group, y[c])` for
/// `r` in 0..4 and every column `c`, bit for bit.
///
/// `y[c]` are activation rows already quantized to `dtype.vec_dot_type()` (Q8_0 for Q4_0 and
/// Q8_0 weights, Q8_1 for Q4_1), `nb` blocks each; any number of columns is accepted, 1 to 8
/// per kernel call are best. `scratch` (at least `4 * row_bytes` bytes) is used only when the
/// CPU lacks the direct kernels ([`fast`]): the group is unpacked there and the per-pair or
/// tiled dots run on it. Unsupported dtypes, or a scratch too small for that path, write NaN.
/// For matrix-vector products over many groups, [`tile_groups`] is faster.
///
/// # Safety
/// `group` points to a whole packed group of `nb` blocks per row (`4 * nb * block_bytes`
/// readable bytes); each `y[c]` to `nb` readable blocks of the vec-dot type; `out` has an
/// element at every `r * out_stride + c`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(
    f: CpuFeatures,
    dtype: DType,
    nb: usize,
    group: *const u8,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
    scratch: &mut [u8],
) {
    // SAFETY: one group, as the caller promises.
    unsafe { tile_groups(f, dtype, nb, group, 1, y, out, out_stride, scratch) }
}

/// Groups a matrix-vector kernel call takes at once: the activation block's loads, scale
/// conversion and Q4_0 correction are then shared by 16 rows instead of 4 (measured: about
/// 1.5x to 2x the one-group kernel on cached weights; more groups would spill registers).
const MV_GROUPS: usize = 4;

/// [`tile`] over `ngroups` consecutive packed groups starting at `groups` (rows `0..4 *
/// ngroups` of a packed range): `out[row * out_stride + c]`. With one column, the direct
/// kernels take four groups per call; with more, pairs of groups by up to 4 columns (both
/// share each activation block's loads and conversions between more rows than [`tile`] can;
/// the pairs are about 15% faster than one group by 8 columns, measured with `cargo bench`).
///
/// # Safety
/// As [`tile`], for `ngroups` whole groups at `groups`, and `out` has an element at every
/// `row * out_stride + c` for `row < 4 * ngroups`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_groups(
    f: CpuFeatures,
    dtype: DType,
    nb: usize,
    groups: *const u8,
    ngroups: usize,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
    scratch: &mut [u8],
) {
    let direct = direct(f, dtype, y.len());
    // SAFETY: as the caller promises; `direct` only where `direct` says so.
    unsafe {
        tile_groups_on(
            f, direct, dtype, nb, groups, ngroups, y, out, out_stride, scratch,
        )
    }
}

/// Whether [`tile_groups`] has a kernel of the packed layout for `ncols` columns of `dtype` on
/// the CPU `f` describes: the AVX-512 VNNI build's ([`fast`]), and the AVX2 build's for one
/// column ([`avx2_matvec`]).
fn direct(f: CpuFeatures, dtype: DType, ncols: usize) -> bool {
    supported(dtype) && (fast(f) || (ncols == 1 && avx2_matvec(f)))
}

/// [`tile_groups`] with the direct kernels (`direct`, see [`direct`]) or the unpacking
/// fallback (the tests run both).
///
/// # Safety
/// As [`tile_groups`]; `direct` only where [`direct`] holds for `f`, `dtype` and `y.len()`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_groups_on(
    f: CpuFeatures,
    direct: bool,
    dtype: DType,
    nb: usize,
    groups: *const u8,
    ngroups: usize,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
    scratch: &mut [u8],
) {
    if nb == 0 {
        // Empty rows: every dot is 0.
        for row in 0..GROUP_ROWS * ngroups {
            for c in 0..y.len() {
                out[row * out_stride + c] = 0.0;
            }
        }
        return;
    }
    if y.is_empty() {
        return;
    }
    let gbytes = geom(dtype).map_or(0, |g| GROUP_ROWS * nb * g.block);
    let group_out = GROUP_ROWS * out_stride;
    #[cfg(target_arch = "x86_64")]
    if direct && y.len() == 1 && avx2_matvec(f) {
        use super::legacy::{Q4_0, Q4_1, Q8_0};
        use super::repack_avx2::matvec;
        // SAFETY: the AVX2 build's features were detected (`avx2_matvec`); `ngroups` whole
        // groups, one column and its rows of `out`, as the caller promises.
        unsafe {
            match dtype {
                DType::Q4_0 => matvec::<Q4_0>(nb, groups, ngroups, y[0], out, out_stride),
                DType::Q4_1 => matvec::<Q4_1>(nb, groups, ngroups, y[0], out, out_stride),
                DType::Q8_0 => matvec::<Q8_0>(nb, groups, ngroups, y[0], out, out_stride),
                _ => {}
            }
        }
        return;
    }
    if !direct {
        for g in 0..ngroups {
            // SAFETY: group `g` of the range the caller promised, and its rows of `out`.
            unsafe {
                tile_unpacked(
                    f,
                    dtype,
                    nb,
                    groups.wrapping_add(g * gbytes),
                    y,
                    &mut out[g * group_out..],
                    out_stride,
                    scratch,
                )
            };
        }
        return;
    }
    let mut g = 0;
    if y.len() == 1 {
        while g + MV_GROUPS <= ngroups {
            // SAFETY: fast(f) holds (the features); `MV_GROUPS` groups of the promised range
            // and their rows of `out`; one column.
            unsafe {
                tile_fast::<MV_GROUPS>(
                    dtype,
                    nb,
                    groups.wrapping_add(g * gbytes),
                    gbytes,
                    y,
                    &mut out[g * group_out..],
                    out_stride,
                )
            };
            g += MV_GROUPS;
        }
    } else {
        while g + 2 <= ngroups {
            for (i, cols) in y.chunks(4).enumerate() {
                // SAFETY: as above, two groups and up to 4 columns.
                unsafe {
                    tile_fast::<2>(
                        dtype,
                        nb,
                        groups.wrapping_add(g * gbytes),
                        gbytes,
                        cols,
                        &mut out[g * group_out + i * 4..],
                        out_stride,
                    )
                };
            }
            g += 2;
        }
    }
    for g in g..ngroups {
        for (i, cols) in y.chunks(MAX_COLS).enumerate() {
            // SAFETY: fast(f) holds (the features); group `g` of the promised range; the
            // offsets keep every written index within what the caller promised.
            unsafe {
                tile_fast::<1>(
                    dtype,
                    nb,
                    groups.wrapping_add(g * gbytes),
                    gbytes,
                    cols,
                    &mut out[g * group_out + i * MAX_COLS..],
                    out_stride,
                )
            };
        }
    }
}

/// The fallback of [`tile`]: unpack the group into `scratch`, then the tiled kernels (which
/// equal the per-pair dots) or the per-pair dots themselves.
///
/// # Safety
/// As [`tile`].
#[allow(clippy::too_many_arguments)]
unsafe fn tile_unpacked(
    f: CpuFeatures,
    dtype: DType,
    nb: usize,
    group: *const u8,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
    scratch: &mut [u8],
) {
    let fill_nan = |out: &mut [f32]| {
        for r in 0..GROUP_ROWS {
            for c in 0..y.len() {
                out[r * out_stride + c] = f32::NAN;
            }
        }
    };
    let Ok(g) = geom(dtype) else {
        fill_nan(out);
        return;
    };
    let row_bytes = nb * g.block;
    let Some(rows) = scratch.get_mut(..GROUP_ROWS * row_bytes) else {
        fill_nan(out);
        return;
    };
    // SAFETY: the caller promises a whole packed group (4 rows of `nb` blocks) at `group`.
    let packed = unsafe { std::slice::from_raw_parts(group, GROUP_ROWS * row_bytes) };
    if unpack(dtype, 32 * nb, packed, rows).is_err() {
        fill_nan(out);
        return;
    }
    if legacy::supported(f, dtype) {
        let base = rows.as_ptr();
        let x: [*const u8; GROUP_ROWS] = std::array::from_fn(|r| base.wrapping_add(r * row_bytes));
        // SAFETY: tiled::supported(f, dtype); the four rows are `nb` dense blocks in scratch;
        // columns and `out` as the caller promises.
        unsafe { legacy::tile(f, dtype, nb, &x, y, out, out_stride) };
        return;
    }
    let yb = nb * dtype.vec_dot_type().block_bytes();
    for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
        for (c, &yc) in y.iter().enumerate() {
            // SAFETY: the caller promises `nb` readable activation blocks at each `y[c]`.
            let ys = unsafe { std::slice::from_raw_parts(yc, yb) };
            out[r * out_stride + c] = dots::vec_dot(f, dtype, 32 * nb, row, ys).unwrap_or(f32::NAN);
        }
    }
}

/// Dispatch of the direct kernels on the dtype and the column count: `G` groups `gbytes`
/// apart, 1 to 8 columns for one group, one column for more.
///
/// # Safety
/// As [`tile_groups`] with `G` groups, on a CPU where [`fast`] holds.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_fast<const G: usize>(
    dtype: DType,
    nb: usize,
    group: *const u8,
    gbytes: usize,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    macro_rules! cols {
        ($f:ident $(, $k:literal)?) => {
            // SAFETY: the features of `$f` were detected (the caller's fast(f)); pointers as
            // promised.
            unsafe {
                match (G, y.len()) {
                    (1, 2) => $f::<$($k,)? 2, 1>(nb, group, gbytes, y, out, out_stride),
                    (1, 3) => $f::<$($k,)? 3, 1>(nb, group, gbytes, y, out, out_stride),
                    (1, 4) => $f::<$($k,)? 4, 1>(nb, group, gbytes, y, out, out_stride),
                    (1, 5) => $f::<$($k,)? 5, 1>(nb, group, gbytes, y, out, out_stride),
                    (1, 6) => $f::<$($k,)? 6, 1>(nb, group, gbytes, y, out, out_stride),
                    (1, 7) => $f::<$($k,)? 7, 1>(nb, group, gbytes, y, out, out_stride),
                    (1, 8) => $f::<$($k,)? 8, 1>(nb, group, gbytes, y, out, out_stride),
                    (2, 2) => $f::<$($k,)? 2, 2>(nb, group, gbytes, y, out, out_stride),
                    (2, 3) => $f::<$($k,)? 3, 2>(nb, group, gbytes, y, out, out_stride),
                    (2, 4) => $f::<$($k,)? 4, 2>(nb, group, gbytes, y, out, out_stride),
                    _ => $f::<$($k,)? 1, G>(nb, group, gbytes, y, out, out_stride),
                }
            }
        };
    }
    match dtype {
        DType::Q4_0 => cols!(tile_q4, false),
        DType::Q4_1 => cols!(tile_q4, true),
        _ => cols!(tile_q8),
    }
}

/// No direct kernels off x86-64 ([`fast`] is false there).
///
/// # Safety
/// Never called.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_fast<const G: usize>(
    _: DType,
    _: usize,
    _: *const u8,
    _: usize,
    _: &[*const u8],
    _: &mut [f32],
    _: usize,
) {
}

/// Q4_0 (`Q41 = false`) or Q4_1 (`Q41 = true`): `G` groups (`gbytes` apart) times `NC`
/// columns.
///
/// One 64-byte load gives the 4 rows' quants `[r0 | r1 | r2 | r3]`; its low nibbles are every
/// row's elements 0..16 and its high nibbles elements 16..32, so `vpdpbusd` against the
/// activation's bytes 0..16 (resp. 16..32) broadcast to the four 128-bit lanes puts row `r`'s
/// pair-dot lanes 0..4 in 32-bit lanes `4r..4r + 4` of `lo` and its lanes 4..8 in those of
/// `hi`. Q4_0's signed `(q - 8) * y` sums come, for one column, from the unsigned `q * y` sums
/// minus `8 * sum(y)`; for several columns (where per-column work counts most) from
/// `(y + 128) * (q - 8)` minus `128 * sum(q - 8)`, the correction computed once per weight
/// block. Both are exact integers.
///
/// The block loop's two halves ([`q4_weights`], [`q4_column`]) and the final sums
/// ([`q4_store`]) are `#[inline(always)]` helpers without features of their own: they are
/// compiled inside this function, under its features, as one body.
///
/// # Safety
/// As [`tile_groups`] with `G` groups and `NC` columns, on a CPU with AVX-512 F/BW/DQ/VL and
/// VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn tile_q4<const Q41: bool, const NC: usize, const G: usize>(
    nb: usize,
    group: *const u8,
    gbytes: usize,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    // Activation block bytes.
    let yb = if Q41 { 36 } else { 34 };
    // SAFETY: reads within the groups and the activation blocks the caller promised, under
    // the features of this function (which the helpers are inlined into).
    unsafe {
        let mut acc = Q4Acc::<NC, G> {
            lo: [[_mm512_setzero_ps(); NC]; G],
            hi: [[_mm512_setzero_ps(); NC]; G],
            summs: [[_mm512_setzero_ps(); 2]; G],
        };
        for i in 0..nb {
            let mut w = q4_weights::<Q41, NC, G>(group, gbytes, i);
            // `c` also picks the column's accumulators (in `q4_column`).
            #[allow(clippy::needless_range_loop)]
            for c in 0..NC {
                let py = y[c].add(i * yb);
                q4_column::<Q41, NC, G>(py, c, &mut w, &mut acc);
            }
        }
        q4_store::<Q41, NC, G>(&acc, out, out_stride);
    }
}

/// [`tile_q4`]'s accumulators: per group and column, the scaled integer sums of the low and
/// high nibbles; per group, Q4_1's min terms (column c's row r in lane 4 * (c % 4) + r of
/// `summs[g][c / 4]`, each lane multiplied then added in block order as the pair dot does).
#[cfg(target_arch = "x86_64")]
struct Q4Acc<const NC: usize, const G: usize> {
    lo: [[__m512; NC]; G],
    hi: [[__m512; NC]; G],
    summs: [[__m512; 2]; G],
}

/// One block of `G` groups of Q4 weights as [`tile_q4`] multiplies it.
#[cfg(target_arch = "x86_64")]
struct Q4Weights<const G: usize> {
    /// The four rows' scales, row r's in lanes 4r..4r + 4.
    dx: [__m512; G],
    /// Q4_1: the four rows' mins in every 128-bit lane.
    mx: [__m512; G],
    /// Low and high nibbles (minus 8 with the correction on the weight side).
    lo: [__m512i; G],
    hi: [__m512i; G],
    /// Q4_0: the correction per 4 bytes the integer sums start from (with the correction on
    /// the activation side, index 0 only, set per column).
    clo: [__m512i; G],
    chi: [__m512i; G],
}

/// Block `i` of each of the `G` groups at `group` (`gbytes` apart), for [`tile_q4`].
///
/// # Safety
/// Block `i` of every group is readable; the CPU has [`tile_q4`]'s features (its only caller,
/// which inlines this under them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4_weights<const Q41: bool, const NC: usize, const G: usize>(
    group: *const u8,
    gbytes: usize,
    i: usize,
) -> Q4Weights<G> {
    // Packed block bytes and quants offset.
    let (pb, pq) = if Q41 { (80, 16) } else { (72, 8) };
    // Q4_0 with the correction on the weight side (see [`tile_q4`]).
    let wside = !Q41 && NC > 1;
    // SAFETY: as the caller promises.
    unsafe {
        // Lane 4r + j takes row r's value.
        let spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let nib = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let bias = _mm512_set1_epi8(-128);
        let zero = _mm512_setzero_si512();
        let mut w = Q4Weights {
            dx: [_mm512_setzero_ps(); G],
            mx: [_mm512_setzero_ps(); G],
            lo: [zero; G],
            hi: [zero; G],
            clo: [zero; G],
            chi: [zero; G],
        };
        for g in 0..G {
            let p = group.add(g * gbytes + i * pb);
            w.dx[g] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(cvtph4_ps(p)));
            if Q41 {
                w.mx[g] = _mm512_broadcast_f32x4(cvtph4_ps(p.add(8)));
            }
            let v = _mm512_loadu_si512(p.add(pq).cast());
            w.lo[g] = _mm512_and_si512(v, nib);
            w.hi[g] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            if wside {
                w.lo[g] = _mm512_sub_epi8(w.lo[g], eight);
                w.hi[g] = _mm512_sub_epi8(w.hi[g], eight);
                // -128 * sum(q - 8) per 4 bytes (0x80 read as unsigned is 128).
                w.clo[g] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w.lo[g]));
                w.chi[g] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w.hi[g]));
            }
        }
        w
    }
}

/// Column `c` (its block at `py`) times the block `w` of every group, into `acc`.
///
/// # Safety
/// The activation block at `py` is readable; `c < NC`; the CPU has [`tile_q4`]'s features (its
/// only caller, which inlines this under them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4_column<const Q41: bool, const NC: usize, const G: usize>(
    py: *const u8,
    c: usize,
    w: &mut Q4Weights<G>,
    acc: &mut Q4Acc<NC, G>,
) {
    // Activation quants offset.
    let yq = if Q41 { 4 } else { 2 };
    // Q4_0 with the correction on the weight side (see [`tile_q4`]).
    let wside = !Q41 && NC > 1;
    // SAFETY: as the caller promises.
    unsafe {
        let eight = _mm512_set1_epi8(8);
        let bias = _mm512_set1_epi8(-128);
        let zero = _mm512_setzero_si512();
        let dy = _mm512_set1_ps(h2f(py));
        let mut ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(py.add(yq).cast()));
        let mut yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(py.add(yq + 16).cast()));
        let sy = if Q41 {
            _mm512_set1_ps(h2f(py.add(2)))
        } else {
            _mm512_setzero_ps()
        };
        if wside {
            ylo = _mm512_xor_si512(ylo, bias);
            yhi = _mm512_xor_si512(yhi, bias);
        } else if !Q41 {
            // -8 * sum(y) per 4 bytes, shared by the groups.
            w.clo[0] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, eight, ylo));
            w.chi[0] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, eight, yhi));
        }
        for g in 0..G {
            let (ilo, ihi) = if wside {
                (
                    _mm512_dpbusd_epi32(w.clo[g], ylo, w.lo[g]),
                    _mm512_dpbusd_epi32(w.chi[g], yhi, w.hi[g]),
                )
            } else if !Q41 {
                (
                    _mm512_dpbusd_epi32(w.clo[0], w.lo[g], ylo),
                    _mm512_dpbusd_epi32(w.chi[0], w.hi[g], yhi),
                )
            } else {
                (
                    _mm512_dpbusd_epi32(zero, w.lo[g], ylo),
                    _mm512_dpbusd_epi32(zero, w.hi[g], yhi),
                )
            };
            if Q41 {
                let lanes: __mmask16 = 0xF << (4 * (c % 4));
                let s = &mut acc.summs[g][c / 4];
                *s = _mm512_mask_add_ps(*s, lanes, *s, _mm512_mul_ps(w.mx[g], sy));
            }
            let d = _mm512_mul_ps(w.dx[g], dy);
            acc.lo[g][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ilo), acc.lo[g][c]);
            acc.hi[g][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ihi), acc.hi[g][c]);
        }
    }
}

/// The outputs of [`tile_q4`] from its accumulators: row r of group g, column c at
/// `out[(4g + r) * out_stride + c]`.
///
/// # Safety
/// As [`tile_q4`] (its only caller, which inlines this under its features).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4_store<const Q41: bool, const NC: usize, const G: usize>(
    acc: &Q4Acc<NC, G>,
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: as the caller promises.
    unsafe {
        for g in 0..G {
            let mut mins = [[0f32; 16]; 2];
            if Q41 {
                for (m, s) in mins.iter_mut().zip(acc.summs[g]) {
                    _mm512_storeu_ps(m.as_mut_ptr(), s);
                }
            }
            for c in 0..NC {
                let s = hsum8x4_ps(acc.lo[g][c], acc.hi[g][c]);
                let mut h = [0f32; 16];
                _mm512_storeu_ps(h.as_mut_ptr(), s);
                for r in 0..GROUP_ROWS {
                    let v = h[4 * r];
                    out[(GROUP_ROWS * g + r) * out_stride + c] = if Q41 {
                        v + mins[c / 4][4 * (c % 4) + r]
                    } else {
                        v
                    };
                }
            }
        }
    }
}

/// Q8_0: `G` groups (`gbytes` apart) times `NC` columns. Two 64-byte loads give rows
/// `[r0 | r1]` and `[r2 | r3]`; the activation's 32 bytes are broadcast to both halves, offset
/// by 128 to make them the unsigned operand of `vpdpbusd`, and the accumulator starts at
/// `-128 * sum(x)` per 4 bytes so that the sums are exactly the signed `x * y` ones.
///
/// # Safety
/// As [`tile_groups`] with `G` groups and `NC` columns, on a CPU with AVX-512 F/BW/DQ/VL and
/// VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn tile_q8<const NC: usize, const G: usize>(
    nb: usize,
    group: *const u8,
    gbytes: usize,
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    const PB: usize = 136;
    const YB: usize = 34;
    // SAFETY: reads within the groups and the activation blocks the caller promised, under
    // the features of this function.
    unsafe {
        let spread_a = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let spread_b = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
        let bias = _mm512_set1_epi8(-128);
        let zero = _mm512_setzero_si512();
        let mut acc_a = [[_mm512_setzero_ps(); NC]; G];
        let mut acc_b = [[_mm512_setzero_ps(); NC]; G];
        for i in 0..nb {
            let mut dxa = [_mm512_setzero_ps(); G];
            let mut dxb = [_mm512_setzero_ps(); G];
            let mut qa = [zero; G];
            let mut qb = [zero; G];
            let mut ca = [zero; G];
            let mut cb = [zero; G];
            for g in 0..G {
                let p = group.add(g * gbytes + i * PB);
                let d4 = _mm512_castps128_ps512(cvtph4_ps(p));
                dxa[g] = _mm512_permutexvar_ps(spread_a, d4);
                dxb[g] = _mm512_permutexvar_ps(spread_b, d4);
                qa[g] = _mm512_loadu_si512(p.add(8).cast());
                qb[g] = _mm512_loadu_si512(p.add(72).cast());
                // -128 * sum(x) per 4 bytes (0x80 read as unsigned is 128).
                ca[g] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, qa[g]));
                cb[g] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, qb[g]));
            }
            for c in 0..NC {
                let py = y[c].add(i * YB);
                let dy = _mm512_set1_ps(h2f(py));
                let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(py.add(2).cast()));
                let uq = _mm512_xor_si512(q, bias);
                for g in 0..G {
                    let ia = _mm512_dpbusd_epi32(ca[g], uq, qa[g]);
                    let ib = _mm512_dpbusd_epi32(cb[g], uq, qb[g]);
                    acc_a[g][c] = _mm512_fmadd_ps(
                        _mm512_mul_ps(dxa[g], dy),
                        _mm512_cvtepi32_ps(ia),
                        acc_a[g][c],
                    );
                    acc_b[g][c] = _mm512_fmadd_ps(
                        _mm512_mul_ps(dxb[g], dy),
                        _mm512_cvtepi32_ps(ib),
                        acc_b[g][c],
                    );
                }
            }
        }
        for g in 0..G {
            for c in 0..NC {
                let [r0, r1] = halves(acc_a[g][c]);
                let [r2, r3] = halves(acc_b[g][c]);
                for (r, v) in [r0, r1, r2, r3].into_iter().enumerate() {
                    out[(GROUP_ROWS * g + r) * out_stride + c] = hsum8(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::blocks::activations::quantize_activations;
    use crate::kernels::dots::vec_dot;
    use crate::kernels::isa::CpuFeatures;
    use half::f16;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// This CPU's features (the tests exercise whatever it has).
    fn hw() -> CpuFeatures {
        CpuFeatures::detect()
    }

    const DTYPES: [DType; 3] = [DType::Q4_0, DType::Q4_1, DType::Q8_0];

    /// This CPU's build and, where it is another, the AVX2 build (whose kernels any x86 CPU
    /// with AVX2 runs).
    fn builds() -> impl Iterator<Item = CpuFeatures> {
        let f = hw();
        let avx2 = f.avx2_only();
        std::iter::once(f).chain((f.has_avx2() && avx2 != f).then_some(avx2))
    }

    /// The AVX2 column kernel reads each row of a packed group ([`row_view`]) as the dense row:
    /// every pair's dot bit for bit, for 1 to 8 columns.
    #[test]
    fn packed_rows_in_the_column_kernel_equal_the_pair_dots() {
        let f = hw().avx2_only();
        if !f.has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = StdRng::seed_from_u64(9);
        for dtype in DTYPES {
            let (nb, cols_max) = (11, legacy::COLS);
            let ne0 = 32 * nb;
            let src = random_rows(&mut rng, dtype, ne0, 4);
            let rb = src.len() / 4;
            let mut packed = vec![0u8; src.len()];
            pack(dtype, ne0, &src, &mut packed).unwrap();
            let cols: Vec<Vec<u8>> = (0..cols_max)
                .map(|_| activation(&mut rng, dtype, ne0))
                .collect();
            let kernel = legacy::cols_kernel(f, dtype).unwrap();
            for nc in 1..=cols_max {
                let y: Vec<*const u8> = cols[..nc].iter().map(|c| c.as_ptr()).collect();
                let mut scales = vec![f32::NAN; legacy::scales_len(nb)];
                for r in 0..4 {
                    let mut out = vec![f32::NAN; cols_max];
                    let row = row_view(dtype, packed.as_ptr(), r).unwrap();
                    // SAFETY: AVX2 (checked); the group holds `nb` blocks per row, each column
                    // `nb` activation blocks; scales and out sized as the kernel needs.
                    unsafe {
                        legacy::widen_scales(dtype, nb, &y, &mut scales);
                        kernel(nb, row, &y, &scales, &mut out);
                    }
                    for c in 0..nc {
                        let x = &src[r * rb..(r + 1) * rb];
                        let want = vec_dot(f, dtype, ne0, x, &cols[c]).unwrap();
                        assert_eq!(
                            out[c].to_bits(),
                            want.to_bits(),
                            "{dtype} {nc} cols ({r}, {c})"
                        );
                    }
                }
            }
        }
    }

    /// `nrows` random dense rows of `dtype`: random quant bytes (Q8_0's in -127..=127, what
    /// the quantizers produce) and random finite, non-zero f16 fields.
    fn random_rows(rng: &mut StdRng, dtype: DType, ne0: usize, nrows: usize) -> Vec<u8> {
        let g = geom(dtype).unwrap();
        let mut v = vec![0u8; nrows * ne0 / 32 * g.block];
        for b in v.chunks_exact_mut(g.block) {
            for f in 0..g.fields {
                let mag: f32 = rng.gen_range(1e-3..2.0);
                let x = if rng.gen_bool(0.5) { mag } else { -mag };
                b[2 * f..2 * f + 2].copy_from_slice(&f16::from_f32(x).to_le_bytes());
            }
            for q in &mut b[2 * g.fields..] {
                *q = if dtype == DType::Q8_0 {
                    rng.gen_range(-127i8..=127) as u8
                } else {
                    rng.gen()
                };
            }
        }
        v
    }

    /// A row of activations quantized as matmul does.
    fn activation(rng: &mut StdRng, dtype: DType, n: usize) -> Vec<u8> {
        let vd = dtype.vec_dot_type();
        let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let mut b = vec![0u8; vd.row_bytes(n).unwrap()];
        quantize_activations(hw(), vd, &v, &mut b).unwrap();
        b
    }

    #[test]
    fn pack_unpack_round_trip() {
        let mut rng = StdRng::seed_from_u64(1);
        for dtype in DTYPES {
            for (ne0, nrows) in [(32, 4), (64, 8), (224, 12), (1536, 4)] {
                let src = random_rows(&mut rng, dtype, ne0, nrows);
                let mut packed = vec![0u8; src.len()];
                pack(dtype, ne0, &src, &mut packed).unwrap();
                assert_ne!(packed, src, "{dtype} {ne0}: packing moved nothing");
                let mut back = vec![0u8; src.len()];
                unpack(dtype, ne0, &packed, &mut back).unwrap();
                assert_eq!(back, src, "{dtype} {ne0}x{nrows}");
                // Group-aligned sub-ranges unpack on their own.
                let gb = src.len() / nrows * 4;
                for (gi, g) in packed.chunks_exact(gb).enumerate() {
                    let mut part = vec![0u8; gb];
                    unpack(dtype, ne0, g, &mut part).unwrap();
                    assert_eq!(part, src[gi * gb..(gi + 1) * gb]);
                }
            }
        }
    }

    #[test]
    fn layout_is_as_documented() {
        let mut rng = StdRng::seed_from_u64(2);
        for dtype in DTYPES {
            let g = geom(dtype).unwrap();
            let ne0 = 96;
            let nb = 3;
            let src = random_rows(&mut rng, dtype, ne0, 4);
            let mut packed = vec![0u8; src.len()];
            pack(dtype, ne0, &src, &mut packed).unwrap();
            let pbytes = 4 * g.block;
            assert_eq!(
                pbytes,
                [72, 80, 136][DTYPES.iter().position(|&d| d == dtype).unwrap()]
            );
            for k in 0..nb {
                let pb = &packed[k * pbytes..(k + 1) * pbytes];
                for r in 0..4 {
                    let b = &src[r * nb * g.block + k * g.block..][..g.block];
                    assert_eq!(pb[2 * r..2 * r + 2], b[..2], "d");
                    if dtype == DType::Q4_1 {
                        assert_eq!(pb[8 + 2 * r..10 + 2 * r], b[2..4], "m");
                    }
                    let qo = 8 * g.fields + r * g.qs;
                    assert_eq!(pb[qo..qo + g.qs], b[2 * g.fields..], "qs");
                }
            }
        }
    }

    #[test]
    fn unpack_row_gives_each_row() {
        let mut rng = StdRng::seed_from_u64(3);
        for dtype in DTYPES {
            let ne0 = 160;
            let src = random_rows(&mut rng, dtype, ne0, 8);
            let rb = src.len() / 8;
            let mut packed = vec![0u8; src.len()];
            pack(dtype, ne0, &src, &mut packed).unwrap();
            for row in 0..8 {
                let mut out = vec![0u8; rb];
                let group = &packed[row / 4 * 4 * rb..];
                unpack_row(dtype, ne0, group, row % 4, &mut out).unwrap();
                assert_eq!(out, src[row * rb..(row + 1) * rb], "{dtype} row {row}");
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let rb = 18;
        let src = vec![1u8; 4 * rb];
        let mut dst = vec![0u8; 4 * rb];
        assert!(pack(DType::Q4_0, 32, &src, &mut dst).is_ok());
        assert!(pack(DType::Q4_K, 256, &src, &mut dst).is_err());
        assert!(pack(DType::F32, 32, &src, &mut dst).is_err());
        assert!(pack(DType::Q4_0, 48, &src, &mut dst).is_err());
        assert!(pack(DType::Q4_0, 0, &src, &mut dst).is_err());
        assert!(pack(DType::Q4_0, 32, &src[..3 * rb], &mut dst[..3 * rb]).is_err());
        assert!(pack(DType::Q4_0, 32, &src, &mut dst[..3 * rb]).is_err());
        assert!(pack(DType::Q4_0, 32, &src[..4 * rb - 1], &mut dst[..4 * rb - 1]).is_err());
        assert!(unpack(DType::Q4_0, 32, &src[..2 * rb], &mut dst[..2 * rb]).is_err());
        assert!(unpack(DType::Q4_0, 64, &src, &mut dst).is_err());
        assert!(unpack(DType::Q4_1, 32, &src, &mut dst).is_err());
        let mut row = vec![0u8; rb];
        assert!(unpack_row(DType::Q4_0, 32, &src, 3, &mut row).is_ok());
        assert!(unpack_row(DType::Q4_0, 32, &src, 4, &mut row).is_err());
        assert!(unpack_row(DType::Q4_0, 32, &src[..4 * rb - 1], 0, &mut row).is_err());
        assert!(unpack_row(DType::Q4_0, 32, &src, 0, &mut row[..rb - 1]).is_err());
        assert!(unpack_row(DType::Q4_0, 33, &src, 0, &mut row).is_err());
    }

    /// `tile` (or, with `fallback`, the unpacking path that non-fast CPUs take) against the
    /// pair dots on random groups, for every dtype, several lengths and 1 to 9 columns.
    fn check_tile(fallback: bool) {
        let mut rng = StdRng::seed_from_u64(4);
        for dtype in DTYPES {
            for nb in [1, 2, 7, 18, 48] {
                let ne0 = 32 * nb;
                let src = random_rows(&mut rng, dtype, ne0, 4);
                let rb = src.len() / 4;
                let mut packed = vec![0u8; src.len()];
                pack(dtype, ne0, &src, &mut packed).unwrap();
                let cols: Vec<Vec<u8>> = (0..9).map(|_| activation(&mut rng, dtype, ne0)).collect();
                let mut scratch = vec![0u8; 4 * rb];
                for nc in 1..=9 {
                    let y: Vec<*const u8> = cols[..nc].iter().map(|c| c.as_ptr()).collect();
                    let stride = 13;
                    let mut out = vec![f32::NAN; 4 * stride];
                    // SAFETY: `packed` is one whole group of `nb` blocks per row; each column
                    // holds `nb` activation blocks; `out` covers 4 rows of stride 13 > nc.
                    unsafe {
                        if fallback {
                            tile_unpacked(
                                hw(),
                                dtype,
                                nb,
                                packed.as_ptr(),
                                &y,
                                &mut out,
                                stride,
                                &mut scratch,
                            );
                        } else {
                            tile(
                                hw(),
                                dtype,
                                nb,
                                packed.as_ptr(),
                                &y,
                                &mut out,
                                stride,
                                &mut scratch,
                            );
                        }
                    }
                    for r in 0..4 {
                        for c in 0..nc {
                            let want =
                                vec_dot(hw(), dtype, ne0, &src[r * rb..(r + 1) * rb], &cols[c])
                                    .unwrap();
                            assert_eq!(
                                out[r * stride + c].to_bits(),
                                want.to_bits(),
                                "{dtype} nb {nb} cols {nc} ({r}, {c}) fallback {fallback}: {} vs {want}",
                                out[r * stride + c]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tile_equals_the_pair_dots() {
        eprintln!("repack fast path: {}", fast(hw()));
        check_tile(false);
    }

    #[test]
    fn fallback_equals_the_pair_dots() {
        check_tile(true);
    }

    /// `tile_groups` over 7 groups (multi-group kernel calls plus remainders) equals the pair
    /// dots, on the direct and the fallback paths.
    #[test]
    fn tile_groups_equals_the_pair_dots() {
        let mut rng = StdRng::seed_from_u64(6);
        for dtype in DTYPES {
            for nb in [1, 7, 18] {
                let ne0 = 32 * nb;
                let ngroups = 7;
                let src = random_rows(&mut rng, dtype, ne0, 4 * ngroups);
                let rb = src.len() / (4 * ngroups);
                let mut packed = vec![0u8; src.len()];
                pack(dtype, ne0, &src, &mut packed).unwrap();
                let cols: Vec<Vec<u8>> = (0..9).map(|_| activation(&mut rng, dtype, ne0)).collect();
                let mut scratch = vec![0u8; 4 * rb];
                for (nc, f) in [1, 2, 3, 9]
                    .into_iter()
                    .flat_map(|nc| builds().map(move |f| (nc, f)))
                {
                    let y: Vec<*const u8> = cols[..nc].iter().map(|c| c.as_ptr()).collect();
                    for fallback in [false, true] {
                        let stride = nc + 2;
                        let mut out = vec![f32::NAN; 4 * ngroups * stride];
                        // SAFETY: `packed` is `ngroups` whole groups of `nb` blocks per row;
                        // each column holds `nb` activation blocks; `out` covers every row;
                        // the direct kernels only where fast(hw()).
                        unsafe {
                            tile_groups_on(
                                f,
                                direct(f, dtype, nc) && !fallback,
                                dtype,
                                nb,
                                packed.as_ptr(),
                                ngroups,
                                &y,
                                &mut out,
                                stride,
                                &mut scratch,
                            );
                        }
                        for row in 0..4 * ngroups {
                            for c in 0..nc {
                                let x = &src[row * rb..(row + 1) * rb];
                                let want = vec_dot(f, dtype, ne0, x, &cols[c]).unwrap();
                                assert_eq!(
                                    out[row * stride + c].to_bits(),
                                    want.to_bits(),
                                    "{dtype} nb {nb} cols {nc} ({row}, {c}) fallback {fallback}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Weights quantized from real-valued rows (not random bytes) also match.
    #[test]
    fn tile_on_quantized_weights() {
        let mut rng = StdRng::seed_from_u64(5);
        for dtype in DTYPES {
            let ne0 = 576;
            let rb = dtype.row_bytes(ne0).unwrap();
            let mut src = vec![0u8; 4 * rb];
            for row in src.chunks_exact_mut(rb) {
                let v: Vec<f32> = (0..ne0).map(|_| rng.gen_range(-1.0..1.0)).collect();
                rgml::quant::quantize_row(dtype, &v, row).unwrap();
            }
            let mut packed = vec![0u8; src.len()];
            pack(dtype, ne0, &src, &mut packed).unwrap();
            let cols: Vec<Vec<u8>> = (0..8).map(|_| activation(&mut rng, dtype, ne0)).collect();
            let y: Vec<*const u8> = cols.iter().map(|c| c.as_ptr()).collect();
            let mut out = vec![f32::NAN; 32];
            let mut scratch = vec![0u8; 4 * rb];
            // SAFETY: one whole group of ne0 / 32 blocks per row; 8 columns of as many blocks.
            unsafe {
                tile(
                    hw(),
                    dtype,
                    ne0 / 32,
                    packed.as_ptr(),
                    &y,
                    &mut out,
                    8,
                    &mut scratch,
                )
            };
            for r in 0..4 {
                for c in 0..8 {
                    let want = vec_dot(hw(), dtype, ne0, &src[r * rb..(r + 1) * rb], &cols[c]);
                    assert_eq!(out[r * 8 + c].to_bits(), want.unwrap().to_bits());
                }
            }
        }
    }
}
