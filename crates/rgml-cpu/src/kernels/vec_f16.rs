//! ggml's `ggml_vec_dot_f16`: the dot product a native ggml-cpu build runs for F16 weights
//! when the activation has a single row (generation steps, and the last position's output
//! projection), where llamafile's tinyBLAS (two rows or more, [`super::matmul::dot_f32`]'s
//! order) declines.
//!
//! Its order: four accumulators of `L` lanes (8 on AVX2, 16 on AVX-512) take consecutive
//! `L`-element slices of each `4L`-element step by FMA; they are folded `0 += 2, 1 += 3, 0 += 1`
//! and the lanes summed with the build's horizontal add (AVX2: halves, then `hadd` twice;
//! AVX-512: `_mm512_reduce_add_ps`); the `n % 4L` leftover products are added one by one in f64
//! and the total rounded to f32 once.

/// `ggml_vec_dot_f16(x, y)` as the build with `wide` (AVX-512) or AVX2 vectors computes it.
/// `x` and `y` hold f16 values widened to f32 (exact), of equal length.
pub(crate) fn vec_dot_f16(f: super::CpuFeatures, x: &[f32], y: &[f32]) -> f32 {
    let wide = f.wide();
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2 and FMA.
        return unsafe { vec_dot_f16_avx2(x, y, wide) };
    }
    if wide {
        lanes::<16>(x, y)
    } else {
        lanes::<8>(x, y)
    }
}

/// [`lanes`] compiled with AVX2 and FMA, so the lane loops become vector FMAs.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn vec_dot_f16_avx2(x: &[f32], y: &[f32], wide: bool) -> f32 {
    if wide {
        lanes::<16>(x, y)
    } else {
        lanes::<8>(x, y)
    }
}

#[inline(always)]
fn lanes<const L: usize>(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let step = 4 * L;
    let np = n - n % step;
    let mut sum = [[0f32; L]; 4];
    for (xs, ys) in x[..np].chunks_exact(step).zip(y[..np].chunks_exact(step)) {
        for (j, acc) in sum.iter_mut().enumerate() {
            let (xj, yj) = (&xs[j * L..(j + 1) * L], &ys[j * L..(j + 1) * L]);
            for l in 0..L {
                acc[l] = xj[l].mul_add(yj[l], acc[l]);
            }
        }
    }
    let [mut s0, mut s1, s2, s3] = sum;
    for ((a, b), (c, d)) in s0.iter_mut().zip(s1.iter_mut()).zip(s2.iter().zip(&s3)) {
        *a += c;
        *b += d;
    }
    for (a, b) in s0.iter_mut().zip(&s1) {
        *a += b;
    }
    let mut total = f64::from(reduce::<L>(&s0));
    for (a, b) in x[np..n].iter().zip(&y[np..n]) {
        total += f64::from(a * b);
    }
    total as f32
}

/// The build's horizontal sum of one accumulator.
#[inline(always)]
fn reduce<const L: usize>(v: &[f32; L]) -> f32 {
    if L == 16 {
        // `_mm512_reduce_add_ps`: high 8 + low 8, high 4 + low 4, then (0 + 2) + (1 + 3).
        let mut h = [0f32; 4];
        for (k, h) in h.iter_mut().enumerate() {
            *h = (v[k + 8] + v[k]) + (v[k + 12] + v[k + 4]);
        }
        (h[0] + h[2]) + (h[1] + h[3])
    } else {
        // AVX: low 4 + high 4, then `hadd` twice: (0 + 1) + (2 + 3).
        let t = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
        (t[0] + t[1]) + (t[2] + t[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuFeatures;
    use half::f16;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn halves(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)).to_f32())
            .collect()
    }

    /// The definition written out lane by lane, independently of [`lanes`].
    fn by_definition(wide: bool, x: &[f32], y: &[f32]) -> f32 {
        let l = if wide { 16 } else { 8 };
        let np = x.len() - x.len() % (4 * l);
        let mut acc = vec![vec![0f32; l]; 4];
        for i in 0..np {
            let (j, lane) = ((i % (4 * l)) / l, i % l);
            acc[j][lane] = x[i].mul_add(y[i], acc[j][lane]);
        }
        let folded: Vec<f32> = (0..l)
            .map(|k| (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]))
            .collect();
        let s = if wide {
            let q: Vec<f32> = (0..4)
                .map(|k| (folded[k + 8] + folded[k]) + (folded[k + 12] + folded[k + 4]))
                .collect();
            (q[0] + q[2]) + (q[1] + q[3])
        } else {
            let q: Vec<f32> = (0..4).map(|k| folded[k] + folded[k + 4]).collect();
            (q[0] + q[1]) + (q[2] + q[3])
        };
        let mut total = f64::from(s);
        for i in np..x.len() {
            total += f64::from(x[i] * y[i]);
        }
        total as f32
    }

    #[test]
    fn follows_ggml_order_and_stays_near_the_f64_dot() {
        let mut rng = StdRng::seed_from_u64(16);
        for isa in ["avx2", "avx512"] {
            let f = CpuFeatures::resolve(Some(isa.parse().unwrap()));
            for n in [1, 31, 64, 100, 576, 1000, 1536] {
                let (x, y) = (halves(&mut rng, n), halves(&mut rng, n));
                let got = vec_dot_f16(f, &x, &y);
                assert_eq!(
                    got.to_bits(),
                    by_definition(f.wide(), &x, &y).to_bits(),
                    "{isa} n={n}"
                );
                let exact: f64 = x
                    .iter()
                    .zip(&y)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let scale: f64 = x
                    .iter()
                    .zip(&y)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                assert!(
                    (f64::from(got) - exact).abs() <= 1e-5 * scale.max(1.0),
                    "{isa} n={n}"
                );
            }
        }
    }
}
