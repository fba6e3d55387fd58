//! The meta buffer: whole split tensors scatter to their devices' slices and gather back,
//! segments included; mirrored tensors reach every device; partial tensors read as sums; a
//! part of a split tensor is an error.

mod common;

use rgml::alloc::TensorAllocator;
use rgml::backend::Buffer;
use rgml::meta::{MetaBuffer, MetaBufferType, Segment, SplitState};
use rgml::{BufferTypeRef, Context, DType};
use std::collections::HashMap;
use std::sync::Arc;

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn split_mirrored_and_partial_tensors_round_trip() {
    let children: Vec<BufferTypeRef> = (0..2)
        .map(|d| common::vec_buffer_type(&format!("D{d}"), usize::MAX))
        .collect();
    let mut states = HashMap::new();
    // "qkv" [4, 6]: rows Q (2 + 2) and K (1 + 1); "w" split by columns 3 + 1; "p" partial.
    states.insert(
        "qkv".to_string(),
        SplitState::Axis {
            axis: 1,
            segments: vec![
                Segment {
                    sizes: vec![2, 2],
                    repeat: 1,
                },
                Segment {
                    sizes: vec![1, 1],
                    repeat: 1,
                },
            ],
        },
    );
    states.insert("w".to_string(), SplitState::axis(0, vec![3, 1]));
    states.insert("p".to_string(), SplitState::Partial);
    let bt: BufferTypeRef =
        Arc::new(MetaBufferType::new(children, Arc::new(states), None).unwrap());
    assert_eq!(bt.name(), "Meta(D0,D1)");
    let mut ctx = Context::new();
    let qkv = ctx.new_tensor(DType::F32, &[4, 6]).unwrap();
    let w = ctx.new_tensor(DType::F32, &[4, 2]).unwrap();
    let p = ctx.new_tensor(DType::F32, &[3]).unwrap();
    let m = ctx.new_tensor(DType::F32, &[5]).unwrap();
    for (id, name) in [(qkv, "qkv"), (w, "w"), (p, "p"), (m, "m")] {
        ctx.set_name(id, name).unwrap();
    }
    let buf = Buffer::alloc(&bt, 1024).unwrap();
    let mut ta = TensorAllocator::new(buf.clone());
    for id in [qkv, w, p, m] {
        ta.alloc(&mut ctx, id).unwrap();
    }
    let vq: Vec<f32> = (0..24).map(|i| i as f32 + 0.5).collect();
    let vw: Vec<f32> = (0..8).map(|i| -(i as f32) - 0.25).collect();
    let vp = [1.0f32, 2.0, 3.0];
    let vm = [9.0f32, 8.0, 7.0, 6.0, 5.0];
    ctx.tensor_set_f32(qkv, &vq).unwrap();
    ctx.tensor_set_f32(w, &vw).unwrap();
    ctx.tensor_set_f32(p, &vp).unwrap();
    ctx.tensor_set_f32(m, &vm).unwrap();
    assert_eq!(ctx.tensor_get_f32(qkv).unwrap(), vq);
    assert_eq!(ctx.tensor_get_f32(w).unwrap(), vw);
    assert_eq!(ctx.tensor_get_f32(p).unwrap(), vp);
    assert_eq!(ctx.tensor_get_f32(m).unwrap(), vm);

    // What each device holds.
    let meta = buf.imp().downcast_ref::<MetaBuffer>().unwrap();
    let child = |d: usize, id, n: usize| {
        let off = ctx[id].data.as_ref().unwrap().offset;
        let mut out = vec![0u8; n * 4];
        meta.children()[d].get(off, &mut out).unwrap();
        floats(&out)
    };
    // Device 1: Q rows 2, 3 and K row 5.
    let rows = |r: &[usize]| -> Vec<f32> {
        r.iter()
            .flat_map(|&i| vq[4 * i..4 * i + 4].to_vec())
            .collect()
    };
    assert_eq!(child(0, qkv, 12), rows(&[0, 1, 4]));
    assert_eq!(child(1, qkv, 12), rows(&[2, 3, 5]));
    assert_eq!(child(1, w, 2), vec![vw[3], vw[7]]);
    assert_eq!(child(1, m, 5), vm.to_vec());
    assert_eq!(child(1, p, 3), vec![0.0; 3]);

    // A partial tensor reads as the sum of its slices.
    let p_off = ctx[p].data.as_ref().unwrap().offset;
    meta.children()[1]
        .set(p_off, &[10f32, 20.0, 30.0].map(f32::to_le_bytes).concat())
        .unwrap();
    assert_eq!(ctx.tensor_get_f32(p).unwrap(), vec![11.0, 22.0, 33.0]);

    // Part of a split tensor: an error, and nothing written.
    assert!(ctx.tensor_set(qkv, 4, &[0u8; 8]).is_err());
    assert_eq!(ctx.tensor_get_f32(qkv).unwrap(), vq);
    let mut part = [0u8; 8];
    assert!(ctx.tensor_get(w, 0, &mut part).is_err());
    // Part of a mirrored tensor is fine.
    ctx.tensor_set(m, 4, &7.5f32.to_le_bytes()).unwrap();
    assert_eq!(ctx.tensor_get_f32(m).unwrap()[1], 7.5);
    assert_eq!(child(1, m, 5)[1], 7.5);

    // The backend records computed tensors' states; a state that does not fit is refused.
    let m_off = ctx[m].data.as_ref().unwrap().offset;
    assert_eq!(meta.split_state(m_off), Some(SplitState::Mirrored));
    assert!(meta
        .record(m_off, &ctx[m], SplitState::axis(0, vec![2, 2]))
        .is_err());
    meta.record(m_off, &ctx[m], SplitState::axis(0, vec![2, 3]))
        .unwrap();
    // Each device's slice is now the first elements of its copy: 2 on device 0, 3 on device 1.
    assert_eq!(
        ctx.tensor_get_f32(m).unwrap(),
        vec![9.0, 7.5, 9.0, 7.5, 7.0]
    );
}

#[test]
fn bad_states_and_types_are_errors() {
    assert!(MetaBufferType::new(vec![], Arc::new(HashMap::new()), None).is_err());
    let children: Vec<BufferTypeRef> = (0..2)
        .map(|d| common::vec_buffer_type(&format!("D{d}"), 4096))
        .collect();
    let mut states = HashMap::new();
    states.insert("t".to_string(), SplitState::axis(0, vec![1, 1, 1]));
    let bt: BufferTypeRef =
        Arc::new(MetaBufferType::new(children, Arc::new(states), None).unwrap());
    assert_eq!(bt.max_size(), 4096);
    let mut ctx = Context::new();
    let t = ctx.new_tensor(DType::F32, &[3]).unwrap();
    ctx.set_name(t, "t").unwrap();
    let buf = Buffer::alloc(&bt, 256).unwrap();
    let mut ta = TensorAllocator::new(buf);
    // Three sizes for two devices.
    assert!(ta.alloc(&mut ctx, t).is_err());
    assert!(ctx[t].data.is_none(), "a refused tensor keeps no storage");
}
