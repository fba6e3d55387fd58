//! The wgpu device's memory: its host buffer type (round trips, copies to and from device
//! buffers, the CPU computing on it), the `buffer_from_host_memory` fallback, memory figures,
//! and multi-buffers when tensors exceed a buffer type's `max_size`. Without an adapter every
//! test skips, unless `RGML_REQUIRE_GPU=1` (set by `scripts/test.sh`, so CI never skips).

use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::BackendParams;
use rgml::{Buffer, Context, DType, DeviceRef, Error, Graph};
use rgml_wgpu::{WgpuDevice, HOST_PAGE};
use std::sync::Arc;
mod common;
use common::first_device;

fn wgpu_device(dev: &DeviceRef) -> &WgpuDevice {
    dev.downcast_ref::<WgpuDevice>()
        .expect("a wgpu registry device is a WgpuDevice")
}

/// Deterministic pseudo-random bytes, none of them zero (so a missed write shows).
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 | 1
        })
        .collect()
}

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(n, seed)
        .into_iter()
        .map(|b| f32::from(b) / 64.0 - 2.0)
        .collect()
}

fn read(buf: &Buffer, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    buf.get(offset, &mut out).unwrap();
    out
}

#[test]
fn host_buffer_type_round_trips() {
    let Some(dev) = first_device() else {
        return;
    };
    assert!(dev.caps().host_buffer);
    let hbt = dev.host_buffer_type().expect("a host buffer type");
    assert!(hbt.is_host());
    assert_eq!(hbt.name(), format!("{}_Host", dev.name()));
    assert!(hbt.alignment() >= 64);
    assert!(hbt.device().is_some_and(|d| d.name() == dev.name()));
    let n = 3 * HOST_PAGE + 77;
    let buf = Buffer::alloc(&hbt, n).unwrap();
    assert!(buf.is_host());
    let base = buf.imp().base().expect("host memory has a base").as_ptr() as usize;
    assert_eq!(base % HOST_PAGE, 0, "host buffers are page-aligned");
    assert_eq!(read(&buf, 0, n), vec![0u8; n], "fresh memory is zeroed");
    let data = random_bytes(n, 1);
    buf.set(0, &data).unwrap();
    assert_eq!(read(&buf, 0, n), data);
    let patch = random_bytes(13, 2);
    buf.set(5, &patch).unwrap();
    assert_eq!(read(&buf, 5, 13), patch);
    buf.memset(100, 0xAB, 9).unwrap();
    assert_eq!(read(&buf, 100, 9), vec![0xAB; 9]);
    assert!(matches!(
        buf.set(n - 1, &[1, 2]),
        Err(Error::OutOfBounds { .. })
    ));
    buf.clear(7).unwrap();
    assert_eq!(read(&buf, 0, n), vec![7u8; n]);
    // An empty buffer is valid.
    let empty = Buffer::alloc(&hbt, 0).unwrap();
    assert_eq!(empty.size(), 0);
}

#[test]
fn copies_between_host_and_device_buffers() {
    let Some(dev) = first_device() else {
        return;
    };
    let hbt = dev.host_buffer_type().unwrap();
    let dbt = dev.buffer_type();
    let n = 4096 + 64;
    let host = Buffer::alloc(&hbt, n).unwrap();
    let data = random_bytes(n, 3);
    host.set(0, &data).unwrap();
    let device = Buffer::alloc(&dbt, n).unwrap();
    // Host -> device, aligned (one queue write) and unaligned (patched edges).
    device.copy_from(0, &host, 0, n).unwrap();
    assert_eq!(read(&device, 0, n), data);
    let more = random_bytes(n, 4);
    let host2 = Buffer::alloc(&hbt, n).unwrap();
    host2.set(0, &more).unwrap();
    device.copy_from(3, &host2, 10, 101).unwrap();
    let mut expect = data.clone();
    expect[3..104].copy_from_slice(&more[10..111]);
    assert_eq!(read(&device, 0, n), expect);
    // Device -> host, aligned and unaligned (one mapped staging buffer each).
    let back = Buffer::alloc(&hbt, n).unwrap();
    back.copy_from(0, &device, 0, n).unwrap();
    assert_eq!(read(&back, 0, n), expect);
    back.clear(0).unwrap();
    back.copy_from(1, &device, 5, 33).unwrap();
    assert_eq!(read(&back, 1, 33), expect[5..38].to_vec());
    assert_eq!(read(&back, 0, 1), vec![0]);
    assert_eq!(read(&back, 34, 1), vec![0]);
    // Other host memory (a CPU buffer) to and from the device.
    let cpu_bt: rgml::BufferTypeRef = Arc::new(rgml_cpu::CpuBufferType::new(
        "CPU_test",
        std::sync::Weak::<rgml_cpu::CpuDevice>::new(),
    ));
    let cpu = Buffer::alloc(&cpu_bt, n).unwrap();
    cpu.set(0, &more).unwrap();
    device.copy_from(0, &cpu, 0, n).unwrap();
    assert_eq!(read(&device, 0, n), more);
    let cpu2 = Buffer::alloc(&cpu_bt, n).unwrap();
    cpu2.copy_from(0, &device, 0, n).unwrap();
    assert_eq!(read(&cpu2, 0, n), more);
    // Out-of-range copies are errors, not panics.
    assert!(device.copy_from(0, &host, n - 4, 8).is_err());
    assert!(back.copy_from(n - 4, &device, 0, 8).is_err());
}

#[test]
fn cpu_computes_on_tensors_in_the_host_buffer_type() {
    let Some(dev) = first_device() else {
        return;
    };
    rgml_cpu::register();
    let cpu = rgml::registry::device("CPU").unwrap();
    let hbt = dev.host_buffer_type().unwrap();
    assert!(cpu.supports_buffer_type(&hbt), "the CPU reads host memory");
    assert!(
        !dev.supports_buffer_type(&hbt),
        "wgpu kernels bind device buffers only"
    );
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::F32, &[16, 8]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[16, 3]).unwrap();
    let b = ctx.new_tensor(DType::F32, &[8, 3]).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let y = ctx.add(y, b).unwrap();
    let buf = alloc_ctx_tensors(&mut ctx, &hbt).unwrap().unwrap();
    assert!(buf.is_host());
    let (wv, xv, bv) = (random_f32(128, 5), random_f32(48, 6), random_f32(24, 7));
    ctx.tensor_set_f32(w, &wv).unwrap();
    ctx.tensor_set_f32(x, &xv).unwrap();
    ctx.tensor_set_f32(b, &bv).unwrap();
    let g = Graph::build(&mut ctx, &[y]).unwrap();
    let mut be = cpu.init_backend(&BackendParams::default()).unwrap();
    be.graph_compute(&ctx, &g).unwrap();
    let got = ctx.tensor_get_f32(y).unwrap();
    for col in 0..3 {
        for row in 0..8 {
            let dot: f32 = (0..16)
                .map(|k| wv[row * 16 + k] * xv[col * 16 + k])
                .sum::<f32>();
            let want = dot + bv[col * 8 + row];
            let have = got[col * 8 + row];
            assert!(
                (have - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{have} vs {want}"
            );
        }
    }
}

#[test]
fn buffer_from_host_memory_is_unsupported() {
    let Some(dev) = first_device() else {
        return;
    };
    assert!(!dev.caps().buffer_from_host_ptr);
    let mem: Arc<dyn rgml::backend::HostMemory> = Arc::new(random_bytes(256, 8));
    let err = dev.buffer_from_host_memory(mem, 256).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(dev.name()) && text.contains("host memory"),
        "{text}"
    );
}

#[test]
fn memory_figures_are_sane() {
    let Some(dev) = first_device() else {
        return;
    };
    let m = dev.memory();
    eprintln!("{}: {} free / {} total bytes", dev.name(), m.free, m.total);
    assert!(m.total > 0 && m.free > 0, "{m:?}");
    assert!(m.free <= m.total, "{m:?}");
    let wdev = wgpu_device(&dev);
    let before = wdev.allocated_bytes();
    let buf = Buffer::alloc(&dev.buffer_type(), (1 << 20) + 3).unwrap();
    // Rounded up to 16 bytes (the widest vector a kernel reads).
    assert_eq!(wdev.allocated_bytes(), before + (1 << 20) + 16);
    let m = dev.memory();
    assert!(m.free <= m.total, "{m:?}");
    drop(buf);
    assert_eq!(wdev.allocated_bytes(), before);
}

#[test]
fn tensors_beyond_max_size_spill_into_multi_buffers() {
    let Some(dev) = first_device() else {
        return;
    };
    let wdev = wgpu_device(&dev);
    let bt = wdev.buffer_type_with_max_size(4096);
    assert_eq!(bt.max_size(), 4096);
    assert!(dev.supports_buffer_type(&bt));
    let mut ctx = Context::new();
    let ids: Vec<_> = (0..9)
        .map(|_| ctx.new_tensor(DType::F32, &[700]).unwrap())
        .collect();
    let sum = ctx.add(ids[0], ids[8]).unwrap();
    let buf = alloc_ctx_tensors(&mut ctx, &bt).unwrap().unwrap();
    assert!(buf.is_multi(), "{} bytes in one buffer", buf.size());
    assert!(buf.parts().len() >= 3);
    assert!(buf.parts().iter().all(|p| p.size() <= 4096));
    let values: Vec<Vec<f32>> = (0..9).map(|i| random_f32(700, 10 + i)).collect();
    for (&id, v) in ids.iter().zip(&values) {
        ctx.tensor_set_f32(id, v).unwrap();
    }
    for (&id, v) in ids.iter().zip(&values) {
        assert_eq!(&ctx.tensor_get_f32(id).unwrap(), v);
    }
    // The first and last tensors live in different parts; a wgpu kernel reads both.
    let part = |id| ctx[id].data.as_ref().map(|d| d.buffer.id());
    assert_ne!(part(ids[0]), part(ids[8]));
    let g = Graph::build(&mut ctx, &[sum]).unwrap();
    let mut be = dev.init_backend(&BackendParams::default()).unwrap();
    be.graph_compute(&ctx, &g).unwrap();
    let want: Vec<f32> = values[0]
        .iter()
        .zip(&values[8])
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(ctx.tensor_get_f32(sum).unwrap(), want);
    // A single tensor larger than max_size is an error, not a panic.
    let mut ctx = Context::new();
    ctx.new_tensor(DType::F32, &[2048]).unwrap();
    let err = alloc_ctx_tensors(&mut ctx, &bt).unwrap_err();
    assert!(matches!(err, Error::TensorTooLarge { .. }), "{err}");
}

/// On Vulkan the device knows its largest device-local heap (the card's memory on a discrete
/// GPU, host memory on lavapipe): at least as large as the largest buffer it allows, so that a
/// model larger than one buffer is not refused as larger than the device.
#[test]
fn vulkan_devices_know_their_heap() {
    let Some(dev) = first_device() else {
        return;
    };
    let w = wgpu_device(&dev);
    if !w.name_str().starts_with("Vulkan") {
        return;
    }
    let heap = w
        .device_local_bytes()
        .expect("a Vulkan adapter reports its heaps");
    let max_buffer = usize::try_from(w.limits().max_buffer_size).unwrap_or(usize::MAX);
    assert!(
        heap >= max_buffer.min(1 << 30),
        "heap {heap}, max buffer {max_buffer}"
    );
}
