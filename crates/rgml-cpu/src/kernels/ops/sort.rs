//! ARGSORT with ggml-cpu's order of equal values. ggml-cpu sorts each row's indices with
//! libstdc++'s `std::sort` and a strict `<` (ascending) or `>` (descending) on the values; that
//! sort is not stable, so ties come out in the order its introsort leaves them. [`std_sort`]
//! is that algorithm step for step (introsort with a median-of-three pivot, heapsort past the
//! depth limit, a final insertion sort of runs above 16 elements), which MoE routers need:
//! equal router scores pick the experts ggml picks.

use crate::kernels::task::{NodeTask, ThreadCtx};
use rgml::{Error, Op, Result};

/// libstdc++'s `_S_threshold`: partitions of at most this many elements are left to the final
/// insertion sort.
const THRESHOLD: usize = 16;

/// ARGSORT of each f32 row of the source into the I32 destination.
pub(crate) fn argsort(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let descending = matches!(task.op, Op::Argsort { descending: true });
    let (dst, src) = (&task.dst, task.src(0)?);
    let n = src.ne[0];
    let too_long = || Error::Backend {
        backend: "CPU".into(),
        message: format!("ARGSORT: rows of {n} elements have indices beyond i32"),
    };
    let n_i32 = i32::try_from(n).map_err(|_| too_long())?;
    let rows = src.ne[1] * src.ne[2] * src.ne[3];
    for r in tc.split(rows) {
        let (i1, i2, i3) = (
            r % src.ne[1],
            (r / src.ne[1]) % src.ne[2],
            r / (src.ne[1] * src.ne[2]),
        );
        let value = |i: i32| {
            // SAFETY: element `i < n` of an in-bounds f32 row of the source (the indices
            // sorted are 0..n).
            unsafe {
                src.row(i1, i2, i3)
                    .add(i as usize * src.nb[0])
                    .cast::<f32>()
                    .read_unaligned()
            }
        };
        // SAFETY: a dense I32 row of `n` elements of the destination (the support check),
        // written by this thread only (rows are split between threads).
        let out = unsafe { std::slice::from_raw_parts_mut(dst.row(i1, i2, i3).cast::<i32>(), n) };
        for (slot, i) in out.iter_mut().zip(0..n_i32) {
            *slot = i;
        }
        match descending {
            true => std_sort(out, &|a, b| value(a) > value(b)),
            false => std_sort(out, &|a, b| value(a) < value(b)),
        }
    }
    Ok(())
}

/// libstdc++'s `std::sort(v.begin(), v.end(), less)`. The scans that libstdc++ leaves unguarded
/// (they stop at a sentinel a strict weak order guarantees) are bounded here too, which changes
/// nothing for such an order and keeps a NaN from reading out of bounds.
pub(crate) fn std_sort<T: Copy>(v: &mut [T], less: &impl Fn(T, T) -> bool) {
    if v.len() > 1 {
        let depth = 2 * (usize::BITS - 1 - v.len().leading_zeros()) as usize;
        introsort_loop(v, depth, less);
        final_insertion_sort(v, less);
    }
}

fn introsort_loop<T: Copy>(v: &mut [T], mut depth: usize, less: &impl Fn(T, T) -> bool) {
    let mut last = v.len();
    while last > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(&mut v[..last], less);
        introsort_loop(&mut v[cut..last], depth, less);
        last = cut;
    }
}

/// `__unguarded_partition_pivot`: the median of the second, middle and last elements moved to
/// the front, then the rest partitioned around it; returns the cut.
fn partition_pivot<T: Copy>(v: &mut [T], less: &impl Fn(T, T) -> bool) -> usize {
    let n = v.len();
    move_median_to_first(v, 0, 1, n / 2, n - 1, less);
    let (mut first, mut last) = (1, n);
    loop {
        while first < n && less(v[first], v[0]) {
            first += 1;
        }
        last -= 1;
        while last > 0 && less(v[0], v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn move_median_to_first<T: Copy>(
    v: &mut [T],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    less: &impl Fn(T, T) -> bool,
) {
    let median = if less(v[a], v[b]) {
        if less(v[b], v[c]) {
            b
        } else if less(v[a], v[c]) {
            c
        } else {
            a
        }
    } else if less(v[a], v[c]) {
        a
    } else if less(v[b], v[c]) {
        c
    } else {
        b
    };
    v.swap(result, median);
}

/// `__final_insertion_sort`: the first 16 elements by insertion sort, each later one moved
/// down into place.
fn final_insertion_sort<T: Copy>(v: &mut [T], less: &impl Fn(T, T) -> bool) {
    let head = v.len().min(THRESHOLD);
    for i in 1..head {
        if less(v[i], v[0]) {
            let value = v[i];
            v.copy_within(0..i, 1);
            v[0] = value;
        } else {
            linear_insert(v, i, less);
        }
    }
    for i in head..v.len() {
        linear_insert(v, i, less);
    }
}

/// `__unguarded_linear_insert`: element `at` moved down past the larger ones before it.
fn linear_insert<T: Copy>(v: &mut [T], mut at: usize, less: &impl Fn(T, T) -> bool) {
    let value = v[at];
    while at > 0 && less(value, v[at - 1]) {
        v[at] = v[at - 1];
        at -= 1;
    }
    v[at] = value;
}

/// `__partial_sort(first, last, last)`: `__make_heap`, then `__sort_heap`.
fn heap_sort<T: Copy>(v: &mut [T], less: &impl Fn(T, T) -> bool) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, less);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let value = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, value, less);
    }
}

/// `__adjust_heap`: the hole at `hole` sifted down to a leaf, then `value` pushed up from it.
fn adjust_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    value: T,
    less: &impl Fn(T, T) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(v[child], v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // `__push_heap`
    let mut parent = hole.saturating_sub(1) / 2;
    while hole > top && less(v[parent], value) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.saturating_sub(1) / 2;
    }
    v[hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, levels: u64, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 32) % levels) as f32
            })
            .collect()
    }

    /// Every path (insertion sort alone, introsort, heapsort from depth 0) gives a sorted
    /// permutation.
    #[test]
    fn every_path_sorts() {
        for n in [0, 1, 2, 5, 16, 17, 40, 300, 1000] {
            for levels in [1, 3, 1000] {
                let x = values(n, levels, n as u64 + levels);
                let check = |sorted: &[usize]| {
                    let mut seen = sorted.to_vec();
                    seen.sort_unstable();
                    assert!(seen.iter().copied().eq(0..n), "a permutation");
                    assert!(sorted.windows(2).all(|w| x[w[0]] <= x[w[1]]), "n {n}");
                };
                let less = |a: usize, b: usize| x[a] < x[b];
                let mut idx: Vec<usize> = (0..n).collect();
                std_sort(&mut idx, &less);
                check(&idx);
                let mut idx: Vec<usize> = (0..n).collect();
                heap_sort(&mut idx, &less);
                check(&idx);
                let mut idx: Vec<usize> = (0..n).collect();
                introsort_loop(&mut idx, 0, &less);
                final_insertion_sort(&mut idx, &less);
                check(&idx);
            }
        }
    }

    /// NaN values (no strict weak order) neither panic nor lose an index.
    #[test]
    fn nan_rows_stay_permutations() {
        let mut x = values(200, 7, 3);
        for i in (0..200).step_by(7) {
            x[i] = f32::NAN;
        }
        let mut idx: Vec<usize> = (0..200).collect();
        std_sort(&mut idx, &|a, b| x[a] > x[b]);
        idx.sort_unstable();
        assert!(idx.iter().copied().eq(0..200));
    }
}
