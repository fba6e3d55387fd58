//! Split states: how one tensor is laid out over the devices of a meta device.
//!
//! A tensor is either split along one axis (each device holds a contiguous run of indices per
//! segment), mirrored (every device holds all of it), or partial (every device holds a tensor
//! of the full shape, and the value is the sum over devices: what a matrix product with a split
//! contraction axis leaves behind).
//!
//! Segments describe tensors whose layout along the split axis is not uniform: a fused QKV
//! weight is three segments (the rows of Q, of K, of V), each split over the devices on its
//! own, so every device gets its slice of Q, of K and of V. A segment may repeat (`repeat`
//! consecutive copies of the same pattern, e.g. interleaved heads).

use crate::error::{Error, Result};

/// One segment of a split axis: `repeat` consecutive runs, each run giving device `d`
/// `sizes[d]` consecutive indices (in order of devices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Indices per device in one run of the segment.
    pub sizes: Vec<usize>,
    /// How many runs of this pattern follow each other.
    pub repeat: usize,
}

impl Segment {
    /// Indices of the axis that the segment covers.
    pub fn len(&self) -> usize {
        self.sizes.iter().sum::<usize>() * self.repeat
    }

    /// Whether the segment covers no index.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a tensor is spread over `n` devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitState {
    /// Split along `axis` (0..4): the axis is the concatenation of `segments`.
    Axis {
        /// The split dimension (ggml order: 0 is the row).
        axis: usize,
        /// The segments along the axis, in order.
        segments: Vec<Segment>,
    },
    /// Every device holds the whole tensor.
    Mirrored,
    /// Every device holds a whole-shape tensor; the value is their sum.
    Partial,
}

impl SplitState {
    /// A plain split of `axis` with `sizes[d]` indices on device `d` (one segment).
    pub fn axis(axis: usize, sizes: Vec<usize>) -> SplitState {
        SplitState::Axis {
            axis,
            segments: vec![Segment { sizes, repeat: 1 }],
        }
    }

    /// The split dimension, for axis splits.
    pub fn split_axis(&self) -> Option<usize> {
        match self {
            SplitState::Axis { axis, .. } => Some(*axis),
            _ => None,
        }
    }

    /// Check the state against a tensor of shape `ne` on `n_devices` devices: the axis exists,
    /// every segment has one size per device and the segments cover the axis exactly.
    pub fn validate(&self, ne: [usize; 4], n_devices: usize) -> Result<()> {
        let SplitState::Axis { axis, segments } = self else {
            return Ok(());
        };
        let bad = |message: String| Err(Error::InvalidSplit(message));
        if *axis >= 4 {
            return bad(format!("split axis {axis} is not one of 0..4"));
        }
        if segments.is_empty() {
            return bad("a split needs at least one segment".into());
        }
        if let Some(s) = segments.iter().find(|s| s.sizes.len() != n_devices) {
            return bad(format!(
                "a segment gives {} sizes for {n_devices} devices",
                s.sizes.len()
            ));
        }
        let covered: usize = segments.iter().map(Segment::len).sum();
        if covered != ne[*axis] {
            return bad(format!(
                "segments cover {covered} indices of axis {axis}, which has {}",
                ne[*axis]
            ));
        }
        Ok(())
    }

    /// Indices of the split axis that device `d` holds (`None` for mirrored and partial
    /// states, which split nothing).
    pub fn local_len(&self, d: usize) -> Option<usize> {
        match self {
            SplitState::Axis { segments, .. } => Some(
                segments
                    .iter()
                    .map(|s| s.sizes.get(d).copied().unwrap_or(0) * s.repeat)
                    .sum(),
            ),
            _ => None,
        }
    }

    /// The shape of device `d`'s slice of a tensor of shape `ne`.
    pub fn local_shape(&self, ne: [usize; 4], d: usize) -> [usize; 4] {
        let mut out = ne;
        if let (SplitState::Axis { axis, .. }, Some(len)) = (self, self.local_len(d)) {
            if *axis < 4 {
                out[*axis] = len;
            }
        }
        out
    }
}

/// Split `total` indices over devices in proportion to `weights`, in whole `granule`s (a
/// quantization block along rows, a head along a head axis). Remainders go to the devices with
/// the largest fractional share, earlier devices first on ties; devices may get nothing.
///
/// Errors: no devices, weights that are negative, not finite or all zero, a zero granule, or a
/// `total` that is not a whole number of granules.
pub fn split_sizes(total: usize, weights: &[f32], granule: usize) -> Result<Vec<usize>> {
    let bad = |message: String| Err(Error::InvalidSplit(message));
    if weights.is_empty() {
        return bad("no devices to split over".into());
    }
    if granule == 0 || !total.is_multiple_of(granule) {
        return bad(format!(
            "{total} indices are not a whole number of granules of {granule}"
        ));
    }
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return bad(format!(
            "split weights must be finite and >= 0: {weights:?}"
        ));
    }
    let sum: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    if sum <= 0.0 {
        return bad("split weights are all zero".into());
    }
    let units = total / granule;
    let exact: Vec<f64> = weights
        .iter()
        .map(|&w| f64::from(w) / sum * units as f64)
        .collect();
    let mut sizes: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut left = units - sizes.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for &d in order.iter().cycle() {
        if left == 0 {
            break;
        }
        sizes[d] += 1;
        left -= 1;
    }
    Ok(sizes.into_iter().map(|s| s * granule).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_uneven_and_granular_sizes() {
        assert_eq!(split_sizes(12, &[1.0, 1.0], 1).unwrap(), vec![6, 6]);
        assert_eq!(split_sizes(10, &[1.0, 1.0, 1.0], 1).unwrap(), vec![4, 3, 3]);
        assert_eq!(split_sizes(576, &[3.0, 1.0], 32).unwrap(), vec![448, 128]);
        // 9 heads of 64 over 2 devices: whole heads only.
        assert_eq!(split_sizes(576, &[1.0, 1.0], 64).unwrap(), vec![320, 256]);
        assert_eq!(
            split_sizes(64, &[1.0, 0.0, 1.0], 32).unwrap(),
            vec![32, 0, 32]
        );
        // Fewer granules than devices: some devices hold nothing.
        assert_eq!(
            split_sizes(64, &[1.0, 1.0, 1.0], 32).unwrap(),
            vec![32, 32, 0]
        );
        for (total, w, g) in [(0, vec![1.0], 1), (10, vec![], 1), (10, vec![0.0], 1)] {
            if total == 0 {
                assert_eq!(split_sizes(total, &w, g).unwrap(), vec![0]);
            } else {
                assert!(split_sizes(total, &w, g).is_err());
            }
        }
        assert!(split_sizes(10, &[1.0, 1.0], 4).is_err());
        assert!(split_sizes(8, &[1.0, f32::NAN], 4).is_err());
        assert!(split_sizes(8, &[1.0, -1.0], 4).is_err());
    }

    #[test]
    fn segments_shapes_and_validation() {
        // Fused QKV rows: Q 8 (4 + 4), K 4 (2 + 2), V 4 (2 + 2).
        let qkv = SplitState::Axis {
            axis: 1,
            segments: vec![
                Segment {
                    sizes: vec![4, 4],
                    repeat: 1,
                },
                Segment {
                    sizes: vec![2, 2],
                    repeat: 2,
                },
            ],
        };
        let ne = [16, 16, 1, 1];
        qkv.validate(ne, 2).unwrap();
        assert_eq!(qkv.local_shape(ne, 0), [16, 8, 1, 1]);
        assert_eq!(qkv.local_shape(ne, 1), [16, 8, 1, 1]);
        assert!(qkv.validate([16, 15, 1, 1], 2).is_err());
        assert!(qkv.validate(ne, 3).is_err());
        assert!(SplitState::axis(4, vec![1]).validate(ne, 1).is_err());
        assert_eq!(SplitState::Mirrored.local_shape(ne, 1), ne);
        assert_eq!(SplitState::Partial.local_shape(ne, 0), ne);
        assert_eq!(
            SplitState::axis(0, vec![10, 6]).local_shape(ne, 1),
            [6, 16, 1, 1]
        );
    }
}
