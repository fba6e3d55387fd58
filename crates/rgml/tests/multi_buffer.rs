//! Multi-buffers on a test-only host buffer type with a small maximum size (4 KiB, alignment
//! 32): `Buffer::multi` itself (addressing across parts, usage and clear propagation, errors)
//! and `alloc_ctx_tensors` spilling a context's tensors into several parts.

mod common;

use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::BufferUsage;
use rgml::{Buffer, BufferTypeRef, Context, DType, Error, TensorId};

const MAX: usize = 4096;

fn buffer_type(name: &str, max_size: usize) -> BufferTypeRef {
    common::vec_buffer_type(name, max_size)
}

fn tensor(ctx: &mut Context, name: &str, n: usize) -> TensorId {
    let id = ctx.new_tensor(DType::F32, &[n]).unwrap();
    ctx.set_name(id, name).unwrap();
    id
}

fn values(id: TensorId, n: usize) -> Vec<f32> {
    (0..n).map(|i| (id.index() * 10_000 + i) as f32).collect()
}

fn buffer_of(ctx: &Context, id: TensorId) -> (u64, usize) {
    let d = ctx[id].data.as_ref().expect("tensor has storage");
    (d.buffer.id(), d.offset)
}

#[test]
fn alloc_ctx_tensors_spills_into_parts_in_creation_order() {
    let bt = buffer_type("small", MAX);
    let mut ctx = Context::new();
    let a = tensor(&mut ctx, "a", 256); // 1024 bytes
    let b = tensor(&mut ctx, "b", 512); // 2048
    let c = tensor(&mut ctx, "c", 300); // 1200: does not fit after a, b (3072 + 1200 > 4096)
    let d = tensor(&mut ctx, "d", 1024); // 4096: a part of its own
    let e = tensor(&mut ctx, "e", 10); // 40
    let cv = ctx.view(c, &[100], &[], 400).unwrap(); // c[100..200]
    let all = [(a, 256), (b, 512), (c, 300), (d, 1024), (e, 10)];

    let buffer = alloc_ctx_tensors(&mut ctx, &bt).unwrap().unwrap();
    assert!(buffer.is_multi());
    let sizes: Vec<usize> = buffer.parts().iter().map(|p| p.size()).collect();
    assert_eq!(sizes, vec![3072, 1200, 4096, 40]);
    assert_eq!(buffer.size(), sizes.iter().sum::<usize>());
    assert!(sizes.iter().all(|&s| s <= MAX));
    let part = |i: usize| buffer.parts()[i].id();
    assert_eq!(buffer_of(&ctx, a), (part(0), 0));
    assert_eq!(buffer_of(&ctx, b), (part(0), 1024));
    assert_eq!(buffer_of(&ctx, c), (part(1), 0));
    assert_eq!(buffer_of(&ctx, d), (part(2), 0));
    assert_eq!(buffer_of(&ctx, e), (part(3), 0));
    assert_eq!(buffer_of(&ctx, cv), (part(1), 400));
    for p in buffer.parts() {
        assert!(buffer.holds(p));
        assert_eq!(p.name(), "small");
    }

    // Round trip through tensors in every part.
    for &(id, n) in &all {
        ctx.tensor_set_f32(id, &values(id, n)).unwrap();
    }
    for &(id, n) in &all {
        assert_eq!(ctx.tensor_get_f32(id).unwrap(), values(id, n));
    }
    assert_eq!(ctx.tensor_get_f32(cv).unwrap(), values(c, 300)[100..200]);

    // The multi-buffer's own bytes are the parts end to end, and reads may span parts.
    let mut span = vec![0u8; 200];
    buffer.get(3000, &mut span).unwrap();
    let b_bytes = ctx.tensor_bytes(b).unwrap();
    let c_bytes = ctx.tensor_bytes(c).unwrap();
    assert_eq!(span[..72], b_bytes[2048 - 72..]);
    assert_eq!(span[72..], c_bytes[..128]);
    buffer.memset(4200, 9, 100).unwrap(); // end of c, start of d
    assert!(ctx.tensor_bytes(c).unwrap()[1128..].iter().all(|&x| x == 9));
    assert!(ctx.tensor_bytes(d).unwrap()[..28].iter().all(|&x| x == 9));
    let err = buffer.get(buffer.size() - 4, &mut [0u8; 8]).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { .. }), "{err}");
    assert!(buffer.host_read().is_none() && buffer.host_write().is_none());

    // Usage and clear reach every part.
    buffer.set_usage(BufferUsage::Weights);
    assert_eq!(buffer.usage(), BufferUsage::Weights);
    assert!(buffer
        .parts()
        .iter()
        .all(|p| p.usage() == BufferUsage::Weights));
    buffer.clear(7).unwrap();
    for &(id, _) in &all {
        assert!(ctx.tensor_bytes(id).unwrap().iter().all(|&x| x == 7));
    }

    // Tensors keep their parts alive after the multi-buffer is dropped.
    drop(buffer);
    ctx.tensor_set_f32(e, &values(e, 10)).unwrap();
    assert_eq!(ctx.tensor_get_f32(e).unwrap(), values(e, 10));

    // Copies between a tensor in a part and one in another buffer.
    let e2 = tensor(&mut ctx, "e2", 10);
    let more = alloc_ctx_tensors(&mut ctx, &bt).unwrap().unwrap();
    assert!(!more.is_multi());
    ctx.tensor_copy(e, e2).unwrap();
    assert_eq!(ctx.tensor_get_f32(e2).unwrap(), values(e, 10));
}

#[test]
fn alloc_ctx_tensors_uses_one_plain_buffer_when_it_fits() {
    let bt = buffer_type("small", MAX);
    let mut ctx = Context::new();
    let a = tensor(&mut ctx, "a", 256);
    let b = tensor(&mut ctx, "b", 768); // 1024 + 3072 = 4096 exactly
    let buffer = alloc_ctx_tensors(&mut ctx, &bt).unwrap().unwrap();
    assert!(!buffer.is_multi());
    assert!(buffer.parts().is_empty());
    assert_eq!(buffer.size(), MAX);
    assert_eq!(buffer_of(&ctx, a).0, buffer.id());
    assert_eq!(buffer_of(&ctx, b), (buffer.id(), 1024));
    assert!(alloc_ctx_tensors(&mut ctx, &bt).unwrap().is_none());
}

#[test]
fn a_tensor_larger_than_max_size_is_an_error_naming_it() {
    let bt = buffer_type("small", MAX);
    let mut ctx = Context::new();
    let a = tensor(&mut ctx, "a", 256);
    tensor(&mut ctx, "huge", 2000); // 8000 bytes
    let err = alloc_ctx_tensors(&mut ctx, &bt).unwrap_err();
    assert!(
        matches!(&err, Error::TensorTooLarge { tensor, size: 8000, max_size: MAX, .. } if tensor == "huge"),
        "{err}"
    );
    assert!(err.to_string().contains("huge"), "{err}");
    assert!(ctx[a].data.is_none(), "nothing is placed on error");
}

#[test]
fn multi_rejects_empty_mixed_and_nested_parts() {
    let bt = buffer_type("small", MAX);
    let other = buffer_type("other", MAX);
    assert!(matches!(
        Buffer::multi(Vec::new()),
        Err(Error::InvalidParams { .. })
    ));
    let p = Buffer::alloc(&bt, 64).unwrap();
    let q = Buffer::alloc(&other, 64).unwrap();
    let err = Buffer::multi(vec![p.clone(), q]).unwrap_err();
    assert!(err.to_string().contains("other"), "{err}");
    let m = Buffer::multi(vec![p.clone(), Buffer::alloc(&bt, 32).unwrap()]).unwrap();
    assert_eq!(m.size(), 96);
    assert!(Buffer::multi(vec![m.clone(), p]).is_err());
    // A buffer larger than max_size cannot be allocated directly.
    assert!(matches!(
        Buffer::alloc(&bt, MAX + 1),
        Err(Error::OutOfMemory { .. })
    ));
    // Writes through the multi-buffer land in the right part.
    m.set(60, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let mut out = [0u8; 4];
    m.parts()[0].get(60, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
    m.parts()[1].get(0, &mut out).unwrap();
    assert_eq!(out, [5, 6, 7, 8]);
    m.reset();
}
