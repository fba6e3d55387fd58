//! Scatter and gather: a whole tensor's bytes to the per-device slices of a [`SplitState`] and
//! back, on the host. The meta buffer uses these for `set` / `get` of split tensors.
//!
//! Slices are dense tensors of [`SplitState::local_shape`]. Along the split axis a tensor is the
//! concatenation of its segments, each run handing consecutive indices to the devices in
//! order, so device `d`'s slice is its runs of every segment, in order. Splitting rows (axis 0)
//! of a quantized type must keep whole blocks.
//!
//! Mirrored tensors scatter a copy to every device and gather from device 0. Partial tensors
//! (the value is the sum over devices) scatter the data to device 0 and zeros elsewhere, and
//! gather by summing, for f32 and f16.

use super::split::SplitState;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The split axis of a dense tensor as `outer × axis × inner`: `inner` bytes per index of the
/// axis (per block for a row split of a quantized type), `outer` repetitions.
struct Layout {
    outer: usize,
    inner: usize,
    /// Elements per unit of the axis (the block size for a row split, else 1).
    per_unit: usize,
}

fn layout(dtype: DType, ne: [usize; 4], axis: usize) -> Result<Layout> {
    let overflow = || Error::SizeOverflow;
    let row = dtype.row_bytes(ne[0])?;
    if axis == 0 {
        let bs = dtype.block_size();
        let outer = ne[1..]
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .ok_or_else(overflow)?;
        return Ok(Layout {
            outer,
            inner: dtype.block_bytes(),
            per_unit: bs,
        });
    }
    let inner = ne[1..axis]
        .iter()
        .try_fold(row, |a, &n| a.checked_mul(n))
        .ok_or_else(overflow)?;
    let outer = ne[axis + 1..]
        .iter()
        .try_fold(1usize, |a, &n| a.checked_mul(n))
        .ok_or_else(overflow)?;
    Ok(Layout {
        outer,
        inner,
        per_unit: 1,
    })
}

/// Bytes of a dense tensor of `dtype` and shape `ne`.
fn dense_bytes(dtype: DType, ne: [usize; 4]) -> Result<usize> {
    let row = dtype.row_bytes(ne[0])?;
    ne[1..]
        .iter()
        .try_fold(row, |a, &n| a.checked_mul(n))
        .ok_or(Error::SizeOverflow)
}

/// The runs of an axis split in order: `(device, units)` pairs covering the axis.
fn runs(state: &SplitState, per_unit: usize) -> Result<Vec<(usize, usize)>> {
    let SplitState::Axis { segments, .. } = state else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for seg in segments {
        for _ in 0..seg.repeat {
            for (d, &n) in seg.sizes.iter().enumerate() {
                if !n.is_multiple_of(per_unit) {
                    return Err(Error::InvalidSplit(format!(
                        "a slice of {n} elements cuts a block of {per_unit}"
                    )));
                }
                if n > 0 {
                    out.push((d, n / per_unit));
                }
            }
        }
    }
    Ok(out)
}

fn check_len(what: &str, want: usize, got: usize) -> Result<()> {
    if want != got {
        return Err(Error::InvalidSplit(format!(
            "{what} has {got} bytes, expected {want}"
        )));
    }
    Ok(())
}

/// Split the bytes of a dense tensor (`dtype`, shape `ne`) into the slices of `state` over
/// `n_devices` devices (see the module docs).
pub fn scatter(
    dtype: DType,
    ne: [usize; 4],
    state: &SplitState,
    n_devices: usize,
    data: &[u8],
) -> Result<Vec<Vec<u8>>> {
    state.validate(ne, n_devices)?;
    check_len("the tensor", dense_bytes(dtype, ne)?, data.len())?;
    match state {
        SplitState::Mirrored => Ok(vec![data.to_vec(); n_devices]),
        SplitState::Partial => Ok((0..n_devices)
            .map(|d| {
                if d == 0 {
                    data.to_vec()
                } else {
                    vec![0u8; data.len()]
                }
            })
            .collect()),
        SplitState::Axis { axis, .. } => {
            let l = layout(dtype, ne, *axis)?;
            let runs = runs(state, l.per_unit)?;
            let mut out: Vec<Vec<u8>> = (0..n_devices)
                .map(|d| dense_bytes(dtype, state.local_shape(ne, d)).map(Vec::with_capacity))
                .collect::<Result<_>>()?;
            let mut at = 0;
            for _ in 0..l.outer {
                for &(d, units) in &runs {
                    let n = units * l.inner;
                    out[d].extend_from_slice(&data[at..at + n]);
                    at += n;
                }
            }
            debug_assert_eq!(at, data.len(), "runs cover the axis (validated)");
            Ok(out)
        }
    }
}

/// Join the slices of `state` (one per device) into the bytes of the dense tensor (`dtype`,
/// shape `ne`); partial slices are summed (f32, f16).
pub fn gather<S: AsRef<[u8]>>(
    dtype: DType,
    ne: [usize; 4],
    state: &SplitState,
    slices: &[S],
) -> Result<Vec<u8>> {
    let n_devices = slices.len();
    state.validate(ne, n_devices)?;
    let total = dense_bytes(dtype, ne)?;
    for (d, s) in slices.iter().enumerate() {
        let want = dense_bytes(dtype, state.local_shape(ne, d))?;
        check_len(&format!("the slice of device {d}"), want, s.as_ref().len())?;
    }
    match state {
        SplitState::Mirrored => slices
            .first()
            .map(|s| s.as_ref().to_vec())
            .ok_or_else(|| Error::InvalidSplit("no slices to gather".into())),
        SplitState::Partial => sum_slices(dtype, total, slices),
        SplitState::Axis { axis, .. } => {
            let l = layout(dtype, ne, *axis)?;
            let runs = runs(state, l.per_unit)?;
            let mut out = Vec::with_capacity(total);
            let mut at = vec![0usize; n_devices];
            for _ in 0..l.outer {
                for &(d, units) in &runs {
                    let n = units * l.inner;
                    out.extend_from_slice(&slices[d].as_ref()[at[d]..at[d] + n]);
                    at[d] += n;
                }
            }
            Ok(out)
        }
    }
}

/// The elementwise sum of partial slices, in device order.
fn sum_slices<S: AsRef<[u8]>>(dtype: DType, total: usize, slices: &[S]) -> Result<Vec<u8>> {
    match dtype {
        DType::F32 => {
            let mut acc = vec![0f32; total / 4];
            for s in slices {
                for (a, b) in acc.iter_mut().zip(s.as_ref().chunks_exact(4)) {
                    *a += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Ok(acc.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
        DType::F16 => {
            let mut acc = vec![0f32; total / 2];
            for s in slices {
                for (a, b) in acc.iter_mut().zip(s.as_ref().chunks_exact(2)) {
                    *a += half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            Ok(acc
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect())
        }
        other => Err(Error::InvalidSplit(format!(
            "partial sums of {other} cannot be gathered"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::split::Segment;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Value of element (i0, i1, i2) of the test tensor: its coordinates, readable in failures.
    fn coord(i0: usize, i1: usize, i2: usize) -> f32 {
        (100 * i2 + 10 * i1 + i0) as f32 + 0.5
    }

    #[test]
    fn rows_split_with_qkv_segments() {
        // [3, 8, 2]: rows 0..4 are "Q" (2 + 2), rows 4..6 "K" (1 + 1), rows 6..8 "V" (1 + 1).
        let ne = [3, 8, 2, 1];
        let v: Vec<f32> = (0..2)
            .flat_map(|i2| (0..8).flat_map(move |i1| (0..3).map(move |i0| coord(i0, i1, i2))))
            .collect();
        let state = SplitState::Axis {
            axis: 1,
            segments: vec![
                Segment {
                    sizes: vec![2, 2],
                    repeat: 1,
                },
                Segment {
                    sizes: vec![1, 1],
                    repeat: 2,
                },
            ],
        };
        let parts = scatter(DType::F32, ne, &state, 2, &f32_bytes(&v)).unwrap();
        let rows = |d: usize| -> Vec<usize> {
            floats(&parts[d])
                .chunks(3)
                .map(|r| ((r[0] - 0.5) as usize / 10) % 10)
                .collect()
        };
        // Device 0: Q rows 0, 1, K row 4, V row 6; device 1: 2, 3, 5, 7 (for both i2).
        assert_eq!(rows(0), vec![0, 1, 4, 6, 0, 1, 4, 6]);
        assert_eq!(rows(1), vec![2, 3, 5, 7, 2, 3, 5, 7]);
        let back = gather(DType::F32, ne, &state, &parts).unwrap();
        assert_eq!(floats(&back), v);
    }

    #[test]
    fn every_axis_round_trips_with_uneven_and_empty_slices() {
        let ne = [4, 3, 5, 2];
        let n: usize = ne.iter().product();
        let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
        let data = f32_bytes(&v);
        for axis in 0..4 {
            let len = ne[axis];
            for sizes in [vec![len, 0, 0], vec![1, len - 1, 0], vec![0, 1, len - 1]] {
                let state = SplitState::axis(axis, sizes.clone());
                let parts = scatter(DType::F32, ne, &state, 3, &data).unwrap();
                for (d, p) in parts.iter().enumerate() {
                    let local: usize = state.local_shape(ne, d).iter().product();
                    assert_eq!(p.len(), local * 4, "axis {axis} sizes {sizes:?}");
                }
                assert_eq!(gather(DType::F32, ne, &state, &parts).unwrap(), data);
            }
        }
    }

    #[test]
    fn quantized_rows_keep_whole_blocks() {
        let ne = [64, 2, 1, 1];
        let v: Vec<f32> = (0..128).map(|i| ((i * 7) % 23) as f32 - 11.0).collect();
        let mut q = vec![0u8; DType::Q8_0.row_bytes(128).unwrap()];
        crate::quant::quantize_row(DType::Q8_0, &v, &mut q).unwrap();
        let state = SplitState::axis(0, vec![32, 32]);
        let parts = scatter(DType::Q8_0, ne, &state, 2, &q).unwrap();
        // Each device: one block of each row; dequantized it is that half of the row.
        let mut half = vec![0f32; 64];
        crate::quant::dequantize_row(DType::Q8_0, &parts[1], &mut half).unwrap();
        let mut full = vec![0f32; 128];
        crate::quant::dequantize_row(DType::Q8_0, &q, &mut full).unwrap();
        assert_eq!(&half[..32], &full[32..64]);
        assert_eq!(&half[32..], &full[96..]);
        assert_eq!(gather(DType::Q8_0, ne, &state, &parts).unwrap(), q);
        let cut = SplitState::axis(0, vec![16, 48]);
        assert!(scatter(DType::Q8_0, ne, &cut, 2, &q).is_err());
    }

    #[test]
    fn mirrored_partial_and_errors() {
        let ne = [3, 2, 1, 1];
        let v = [1.5f32, -2.0, 3.25, 4.0, 0.5, -6.0];
        let data = f32_bytes(&v);
        let m = scatter(DType::F32, ne, &SplitState::Mirrored, 3, &data).unwrap();
        assert!(m.iter().all(|p| *p == data));
        assert_eq!(
            gather(DType::F32, ne, &SplitState::Mirrored, &m).unwrap(),
            data
        );
        let p = scatter(DType::F32, ne, &SplitState::Partial, 2, &data).unwrap();
        assert_eq!(
            gather(DType::F32, ne, &SplitState::Partial, &p).unwrap(),
            data
        );
        // Partial sums add up.
        let twice = gather(DType::F32, ne, &SplitState::Partial, &[&data, &data]).unwrap();
        assert_eq!(
            floats(&twice),
            v.iter().map(|x| x * 2.0).collect::<Vec<_>>()
        );
        // Wrong sizes, wrong slice lengths, too few devices.
        assert!(scatter(DType::F32, ne, &SplitState::Mirrored, 2, &data[..20]).is_err());
        assert!(gather(
            DType::F32,
            ne,
            &SplitState::axis(1, vec![1, 1]),
            &[&data[..12], &data[..8]]
        )
        .is_err());
        assert!(scatter(DType::F32, ne, &SplitState::axis(1, vec![1, 1]), 3, &data).is_err());
        assert!(gather(
            DType::Q8_0,
            [32, 1, 1, 1],
            &SplitState::Partial,
            &[vec![0u8; 34]]
        )
        .is_err());
    }
}
