//! The core's test backend itself (`rgml::testing::TestDevice`): each kernel against a float64
//! reference on random data (strided sources and destinations included), and the refusals the
//! scheduler and meta device tests rely on: unsupported nodes, memory the device cannot use,
//! unknown parameters.

use rgml::alloc::alloc_ctx_tensors;
use rgml::testing::TestDevice;
use rgml::{Context, DType, Device, Error, Graph, OpKind, TensorId};
use std::sync::Arc;

mod common;
use common::random;

/// A binary op builder of `Context`.
type Binary = fn(&mut Context, TensorId, TensorId) -> rgml::Result<TensorId>;
/// Its float64 reference.
type Reference = fn(f64, f64) -> f64;

/// Leaves `[a, b, ...]` of the given shapes, filled at random once `run` places them.
struct Case {
    ctx: Context,
    leaves: Vec<(TensorId, Vec<f32>)>,
}

impl Case {
    fn new() -> Case {
        Case {
            ctx: Context::new(),
            leaves: Vec::new(),
        }
    }

    fn leaf(&mut self, dims: &[usize]) -> (TensorId, Vec<f32>) {
        let id = self.ctx.new_tensor(DType::F32, dims).unwrap();
        let v = random(self.leaves.len() as u64 + 1, dims.iter().product());
        self.leaves.push((id, v.clone()));
        (id, v)
    }

    /// Place everything on `dev`, compute `out`, and return its values.
    fn run(mut self, dev: &Arc<TestDevice>, out: TensorId) -> Vec<f32> {
        let graph = Graph::build(&mut self.ctx, &[out]).unwrap();
        let _buf = alloc_ctx_tensors(&mut self.ctx, &dev.buffer_type()).unwrap();
        for (id, v) in &self.leaves {
            self.ctx.tensor_set_f32(*id, v).unwrap();
        }
        let mut b = dev.init_backend(&Default::default()).unwrap();
        b.graph_compute(&self.ctx, &graph).unwrap();
        let root = self.ctx[out].view_src.unwrap_or(out);
        self.ctx.tensor_get_f32(root).unwrap()
    }
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn elementwise_kernels_broadcast_and_match_the_reference() {
    let dev = TestDevice::accel("T");
    let ops: [(Binary, Reference); 4] = [
        (Context::add, |x, y| x + y),
        (Context::sub, |x, y| x - y),
        (Context::mul, |x, y| x * y),
        (Context::div, |x, y| x / y),
    ];
    for (build, f) in ops {
        let mut c = Case::new();
        let (a, av) = c.leaf(&[4, 3, 2]);
        // One row broadcast over dims 1 and 2.
        let (b, bv) = c.leaf(&[4, 1, 1]);
        let out = build(&mut c.ctx, a, b).unwrap();
        let want: Vec<f64> = (0..24).map(|i| f(av[i] as f64, bv[i % 4] as f64)).collect();
        assert_close(&c.run(&dev, out), &want, "binary op");
    }
    let mut c = Case::new();
    let (a, av) = c.leaf(&[6, 2]);
    let s = c.ctx.scale_bias(a, 1.5, -0.25).unwrap();
    let out = c.ctx.silu(s).unwrap();
    let want: Vec<f64> = av
        .iter()
        .map(|&x| {
            let y = x as f64 * 1.5 - 0.25;
            y / (1.0 + (-y).exp())
        })
        .collect();
    assert_close(&c.run(&dev, out), &want, "scale + silu");
}

#[test]
fn products_norms_and_rows_match_the_reference() {
    let dev = TestDevice::accel("T");
    // a [5, 3, 1, 2] broadcast over b [5, 4, 2, 2] in dim 2.
    let mut c = Case::new();
    let (a, av) = c.leaf(&[5, 3, 1, 2]);
    let (b, bv) = c.leaf(&[5, 4, 2, 2]);
    let out = c.ctx.mul_mat(a, b).unwrap();
    let mut want = Vec::new();
    for i3 in 0..2 {
        for i2 in 0..2 {
            for n in 0..4 {
                for m in 0..3 {
                    let dot: f64 = (0..5)
                        .map(|k| {
                            av[k + 5 * (m + 3 * i3)] as f64
                                * bv[k + 5 * (n + 4 * (i2 + 2 * i3))] as f64
                        })
                        .sum();
                    want.push(dot);
                }
            }
        }
    }
    assert_close(&c.run(&dev, out), &want, "mul_mat");

    let mut c = Case::new();
    let (a, av) = c.leaf(&[6, 3]);
    let out = c.ctx.rms_norm(a, 1e-6).unwrap();
    let want: Vec<f64> = av
        .chunks(6)
        .flat_map(|r| {
            let ms = r.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / 6.0;
            r.iter().map(move |&x| x as f64 / (ms + 1e-6).sqrt())
        })
        .collect();
    assert_close(&c.run(&dev, out), &want, "rms_norm");

    let mut c = Case::new();
    let (t, tv) = c.leaf(&[3, 5]);
    let idx = c.ctx.new_tensor(DType::I32, &[4]).unwrap();
    let out = c.ctx.get_rows(t, idx).unwrap();
    let graph = Graph::build(&mut c.ctx, &[out]).unwrap();
    let _buf = alloc_ctx_tensors(&mut c.ctx, &dev.buffer_type()).unwrap();
    c.ctx.tensor_set_f32(t, &tv).unwrap();
    c.ctx.tensor_set_i32(idx, &[4, 0, 2, 4]).unwrap();
    let mut b = dev.init_backend(&Default::default()).unwrap();
    b.graph_compute(&c.ctx, &graph).unwrap();
    let want: Vec<f64> = [4, 0, 2, 4]
        .iter()
        .flat_map(|&r| tv[r * 3..r * 3 + 3].iter().map(|&x| x as f64))
        .collect();
    assert_close(&c.ctx.tensor_get_f32(out).unwrap(), &want, "get_rows");
    // An index past the table is an error, not a panic.
    c.ctx.tensor_set_i32(idx, &[0, 5, 0, 0]).unwrap();
    assert!(b.graph_compute(&c.ctx, &graph).is_err());
}

#[test]
fn strided_sources_and_destinations() {
    let dev = TestDevice::accel("T");
    // CONT of a transpose reads through the strides.
    let mut c = Case::new();
    let (a, av) = c.leaf(&[4, 3]);
    let t = c.ctx.transpose(a).unwrap();
    let out = c.ctx.cont(t).unwrap();
    let want: Vec<f64> = (0..12).map(|k| av[(k % 3) * 4 + k / 3] as f64).collect();
    assert_close(&c.run(&dev, out), &want, "cont(transpose)");

    // CPY into row 1 of a [4, 3] destination writes that row only.
    let mut c = Case::new();
    let (src, sv) = c.leaf(&[4]);
    let (dst, dv) = c.leaf(&[4, 3]);
    let row = c.ctx.view(dst, &[4], &[], 16).unwrap();
    let out = c.ctx.cpy(src, row).unwrap();
    let mut want: Vec<f64> = dv.iter().map(|&x| x as f64).collect();
    for i in 0..4 {
        want[4 + i] = sv[i] as f64;
    }
    assert_close(&c.run(&dev, out), &want, "cpy into a row");
}

#[test]
fn refusals_are_errors() {
    // NORM has no kernel: asking for it changes nothing.
    let a_dev = TestDevice::builder("A")
        .ops(&[OpKind::Add, OpKind::Scale, OpKind::Norm])
        .build();
    let b_dev = TestDevice::accel("B");
    assert!(!TestDevice::KERNELS.contains(&OpKind::Norm));

    // An op the device was built without, and one no kernel computes.
    for (build, op) in [
        (Context::mul as Binary, OpKind::Mul),
        (Context::add, OpKind::Add),
    ] {
        let mut c = Case::new();
        let (x, _) = c.leaf(&[4]);
        let (y, _) = c.leaf(&[4]);
        let z = build(&mut c.ctx, x, y).unwrap();
        let n = c.ctx.norm(z, 1e-5).unwrap();
        let graph = Graph::build(&mut c.ctx, &[n]).unwrap();
        let _buf = alloc_ctx_tensors(&mut c.ctx, &a_dev.buffer_type()).unwrap();
        assert_eq!(a_dev.supports_op(&c.ctx, z), op != OpKind::Mul);
        assert!(!a_dev.supports_op(&c.ctx, n));
        let mut b = a_dev.init_backend(&Default::default()).unwrap();
        let err = b.graph_compute(&c.ctx, &graph).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        // Checked before anything runs.
        assert!(a_dev.take_computed().is_empty());
    }

    // A source in another device's memory.
    let mut c = Case::new();
    let (x, _) = c.leaf(&[4]);
    let _in_b = alloc_ctx_tensors(&mut c.ctx, &b_dev.buffer_type()).unwrap();
    let y = c.ctx.scale(x, 2.0).unwrap();
    let graph = Graph::build(&mut c.ctx, &[y]).unwrap();
    let _in_a = alloc_ctx_tensors(&mut c.ctx, &a_dev.buffer_type()).unwrap();
    let mut b = a_dev.init_backend(&Default::default()).unwrap();
    let err = b.graph_compute(&c.ctx, &graph).unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");

    // A CPU device reads host memory of other devices; an accelerator's memory is not host.
    let cpu = TestDevice::cpu("CPU");
    let host = TestDevice::cpu("CPU2");
    assert!(cpu.supports_buffer_type(&host.buffer_type()));
    assert!(!cpu.supports_buffer_type(&b_dev.buffer_type()));
    assert!(!b_dev.supports_buffer_type(&host.buffer_type()));

    let params = rgml::backend::BackendParams::parse("n_threads=2").unwrap();
    assert!(cpu.init_backend(&params).is_err());
}
