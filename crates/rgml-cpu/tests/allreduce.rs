//! The meta device's all-reduce over real CPU devices (`CPU0`, `CPU1`, ..., each with its own
//! buffer type), asynchronous and synchronous streams: sums against an f64 reference, bitwise
//! identical results on every device, empty tensors, non-contributing devices, error cases.
//! `allreduce_timing` (ignored) prints the cost of one all-reduce.

use rand::{Rng, SeedableRng};
use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::{Backend, BackendParams, DeviceRef};
use rgml::meta::AllReduce;
use rgml::{Context, DType, Error, TensorId};
use rgml_cpu::CpuRegistry;

fn devices(n: usize) -> Vec<DeviceRef> {
    let reg = CpuRegistry::with_devices((0..n).map(|i| format!("CPU{i}")));
    rgml::registry::Registry::devices(&reg).to_vec()
}

fn backends(devs: &[DeviceRef], asynchronous: bool) -> Vec<Box<dyn Backend>> {
    let params = format!("n_threads=1,async={}", u8::from(asynchronous));
    devs.iter()
        .map(|d| {
            d.init_backend(&BackendParams::parse(&params).unwrap())
                .unwrap()
        })
        .collect()
}

/// One f32 tensor of shape `dims` per device, each in its own device's memory (one context per
/// device for allocation, then gathered into one context by allocating device by device).
fn tensors(ctx: &mut Context, devs: &[DeviceRef], dims: &[usize]) -> Vec<TensorId> {
    let mut ids = Vec::new();
    for (d, dev) in devs.iter().enumerate() {
        let id = ctx.new_tensor(DType::F32, dims).unwrap();
        ctx.set_name(id, format!("partial{d}")).unwrap();
        alloc_ctx_tensors(ctx, &dev.buffer_type()).unwrap();
        ids.push(id);
    }
    ids
}

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f32 = r.gen_range(-2.0..2.0);
            // Non-zero everywhere, so a missing contribution always shows.
            if v.abs() < 1e-3 {
                1.0
            } else {
                v
            }
        })
        .collect()
}

/// Fill, all-reduce (twice, to check reuse), compare with the f64 sum and across devices.
fn check(n: usize, dims: &[usize], asynchronous: bool, seed: u64) {
    let devs = devices(n);
    let mut be = backends(&devs, asynchronous);
    let mut ctx = Context::new();
    let ids = tensors(&mut ctx, &devs, dims);
    let mut ar = AllReduce::new(&mut be, dims).unwrap();
    let len: usize = dims.iter().product();
    for round in 0..2u64 {
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|d| random(seed * 1000 + round * 100 + d as u64, len))
            .collect();
        for (d, id) in ids.iter().enumerate() {
            ctx.tensor_set_f32(*id, &inputs[d]).unwrap();
        }
        ar.run(&mut be, &ctx, &ids).unwrap();
        for b in be.iter_mut() {
            b.synchronize().unwrap();
        }
        let first = ctx.tensor_get_f32(ids[0]).unwrap();
        for i in 0..len {
            let want: f64 = inputs.iter().map(|v| v[i] as f64).sum();
            let got = first[i] as f64;
            let tol = 1e-6
                * want
                    .abs()
                    .max(inputs.iter().map(|v| v[i].abs() as f64).sum());
            assert!(
                (got - want).abs() <= tol,
                "n={n} dims={dims:?} elem {i}: got {got}, want {want}"
            );
        }
        for (d, id) in ids.iter().enumerate().skip(1) {
            let other = ctx.tensor_get_f32(*id).unwrap();
            let same = first
                .iter()
                .zip(&other)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "n={n}: device {d} differs from device 0");
        }
    }
}

#[test]
fn sums_on_2_to_5_devices() {
    for asynchronous in [true, false] {
        for n in 1..=5 {
            check(n, &[576], asynchronous, n as u64);
            check(n, &[7, 3, 2, 2], asynchronous, 10 + n as u64);
        }
    }
}

#[test]
fn sums_on_8_devices_large() {
    check(8, &[64, 33], true, 99);
    check(6, &[64, 33], true, 98);
}

#[test]
fn zero_elements_are_a_no_op() {
    for n in [1, 2, 3] {
        let devs = devices(n);
        let mut be = backends(&devs, true);
        let mut ctx = Context::new();
        // Zero-element tensors get no storage: that is fine for an empty all-reduce.
        let ids: Vec<TensorId> = (0..n)
            .map(|_| ctx.new_tensor(DType::F32, &[0, 4]).unwrap())
            .collect();
        let mut ar = AllReduce::new(&mut be, &[0, 4]).unwrap();
        ar.run(&mut be, &ctx, &ids).unwrap();
        ar.run(&mut be, &ctx, &ids).unwrap();
    }
}

#[test]
fn non_contributors_receive_the_sum() {
    let devs = devices(5);
    let mut be = backends(&devs, true);
    let mut ctx = Context::new();
    let ids = tensors(&mut ctx, &devs, &[10, 3]);
    let contributes = [true, false, true, true, false];
    let mut ar = AllReduce::with_contributors(&mut be, &[10, 3], &contributes).unwrap();
    let inputs: Vec<Vec<f32>> = (0..5).map(|d| random(500 + d, 30)).collect();
    for (d, id) in ids.iter().enumerate() {
        // Non-contributors hold garbage that must be ignored.
        let v = if contributes[d] {
            inputs[d].clone()
        } else {
            vec![f32::NAN; 30]
        };
        ctx.tensor_set_f32(*id, &v).unwrap();
    }
    ar.run(&mut be, &ctx, &ids).unwrap();
    for b in be.iter_mut() {
        b.synchronize().unwrap();
    }
    let first = ctx.tensor_get_f32(ids[0]).unwrap();
    for i in 0..30 {
        let want: f64 = (0..5)
            .filter(|&d| contributes[d])
            .map(|d| inputs[d][i] as f64)
            .sum();
        assert!((first[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0));
    }
    for id in &ids[1..] {
        let v = ctx.tensor_get_f32(*id).unwrap();
        assert!(v
            .iter()
            .zip(&first)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    // Nobody contributes: everyone gets the empty sum, zero.
    let mut ar = AllReduce::with_contributors(&mut be, &[10, 3], &[false; 5]).unwrap();
    ar.run(&mut be, &ctx, &ids).unwrap();
    for b in be.iter_mut() {
        b.synchronize().unwrap();
    }
    for id in &ids {
        assert!(ctx.tensor_get_f32(*id).unwrap().iter().all(|&x| x == 0.0));
    }
}

#[test]
fn storage_can_move_between_runs() {
    let devs = devices(3);
    let mut be = backends(&devs, true);
    let mut ar = AllReduce::new(&mut be, &[16]).unwrap();
    for round in 0..3 {
        let mut ctx = Context::new();
        let ids = tensors(&mut ctx, &devs, &[16]);
        for (d, id) in ids.iter().enumerate() {
            ctx.tensor_set_f32(*id, &[(d + round) as f32; 16]).unwrap();
        }
        ar.run(&mut be, &ctx, &ids).unwrap();
        for b in be.iter_mut() {
            b.synchronize().unwrap();
        }
        let want = (3 * round + 3) as f32;
        for id in &ids {
            assert_eq!(ctx.tensor_get_f32(*id).unwrap(), vec![want; 16]);
        }
    }
}

#[test]
fn errors_not_panics() {
    let devs = devices(3);
    let mut be = backends(&devs, true);
    let mut ctx = Context::new();
    let ids = tensors(&mut ctx, &devs, &[8, 2]);
    let mut ar = AllReduce::new(&mut be, &[8, 2]).unwrap();

    // Planning.
    assert!(AllReduce::new(&mut [], &[4]).is_err());
    assert!(matches!(
        AllReduce::with_contributors(&mut be, &[4], &[true]),
        Err(Error::LengthMismatch { .. })
    ));

    // Wrong number of tensors.
    assert!(matches!(
        ar.run(&mut be, &ctx, &ids[..2]),
        Err(Error::LengthMismatch { .. })
    ));
    // Wrong number of backends.
    assert!(matches!(
        ar.run(&mut be[..2], &ctx, &ids[..2]),
        Err(Error::LengthMismatch { .. })
    ));
    // Backends in another order than planned.
    be.swap(0, 1);
    assert!(ar.run(&mut be, &ctx, &ids).is_err());
    be.swap(0, 1);

    // Shape mismatch.
    let odd = ctx.new_tensor(DType::F32, &[16]).unwrap();
    alloc_ctx_tensors(&mut ctx, &devs[2].buffer_type()).unwrap();
    assert!(matches!(
        ar.run(&mut be, &ctx, &[ids[0], ids[1], odd]),
        Err(Error::ShapeMismatch { .. })
    ));
    // Dtype mismatch.
    let half = ctx.new_tensor(DType::F16, &[8, 2]).unwrap();
    alloc_ctx_tensors(&mut ctx, &devs[2].buffer_type()).unwrap();
    assert!(matches!(
        ar.run(&mut be, &ctx, &[ids[0], ids[1], half]),
        Err(Error::UnsupportedDType { .. })
    ));
    // No storage.
    let bare = ctx.new_tensor(DType::F32, &[8, 2]).unwrap();
    assert!(matches!(
        ar.run(&mut be, &ctx, &[ids[0], ids[1], bare]),
        Err(Error::NoStorage(_))
    ));
    // Memory of another device (CPU1's buffer type for backend CPU2).
    let foreign_mem = ctx.new_tensor(DType::F32, &[8, 2]).unwrap();
    alloc_ctx_tensors(&mut ctx, &devs[1].buffer_type()).unwrap();
    let err = ar
        .run(&mut be, &ctx, &[ids[0], ids[1], foreign_mem])
        .unwrap_err();
    assert!(err.to_string().contains("cannot use"), "{err}");
    // The same tensor twice (two streams of one device, so the memory check passes).
    let mut be2 = backends(&[devs[0].clone(), devs[0].clone()], true);
    let mut ar2 = AllReduce::new(&mut be2, &[8, 2]).unwrap();
    let err = ar2.run(&mut be2, &ctx, &[ids[0], ids[0]]).unwrap_err();
    assert!(err.to_string().contains("shares its storage"), "{err}");
    // Not contiguous: a transposed square tensor has the planned shape but not its layout.
    let sq: Vec<TensorId> = tensors(&mut ctx, &devs, &[4, 4]);
    let mut ar_sq = AllReduce::new(&mut be, &[4, 4]).unwrap();
    let t = ctx.transpose(sq[2]).unwrap();
    ctx.init_view(t).unwrap();
    let err = ar_sq.run(&mut be, &ctx, &[sq[0], sq[1], t]).unwrap_err();
    assert!(err.to_string().contains("contiguous"), "{err}");
    ar_sq.run(&mut be, &ctx, &sq).unwrap();
    // An unknown tensor id.
    let mut other = Context::new();
    for _ in 0..100 {
        other.new_tensor(DType::F32, &[1]).unwrap();
    }
    let foreign = other.ids().last().unwrap();
    assert!(ar.run(&mut be, &ctx, &[ids[0], ids[1], foreign]).is_err());

    // After all that, a good run still works.
    for (d, id) in ids.iter().enumerate() {
        ctx.tensor_set_f32(*id, &[d as f32 + 1.0; 16]).unwrap();
    }
    ar.run(&mut be, &ctx, &ids).unwrap();
    for b in be.iter_mut() {
        b.synchronize().unwrap();
    }
    for id in &ids {
        assert_eq!(ctx.tensor_get_f32(*id).unwrap(), vec![6.0; 16]);
    }
}

/// Prints the time of one all-reduce (mean over many runs, after warm-up):
/// `cargo test --release -p rgml-cpu --test allreduce -- --ignored --nocapture`.
#[test]
#[ignore]
fn allreduce_timing() {
    for asynchronous in [true, false] {
        for n in [2, 4] {
            for dims in [vec![576], vec![576, 64]] {
                let devs = devices(n);
                let mut be = backends(&devs, asynchronous);
                let mut ctx = Context::new();
                let ids = tensors(&mut ctx, &devs, &dims);
                let len: usize = dims.iter().product();
                for (d, id) in ids.iter().enumerate() {
                    ctx.tensor_set_f32(*id, &random(d as u64, len)).unwrap();
                }
                let mut ar = AllReduce::new(&mut be, &dims).unwrap();
                let mut once = |be: &mut Vec<Box<dyn Backend>>| {
                    ar.run(be, &ctx, &ids).unwrap();
                    for b in be.iter_mut() {
                        b.synchronize().unwrap();
                    }
                };
                for _ in 0..50 {
                    once(&mut be);
                }
                let iters = 2000;
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    once(&mut be);
                }
                let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
                println!(
                    "all-reduce {:>9} f32 on {n} CPU devices ({}): {us:8.1} us",
                    format!("{dims:?}"),
                    if asynchronous { "async" } else { "sync" }
                );
            }
        }
    }
}
