//! Split-state propagation rules (meta device): each op's rule, segments, the reductions a
//! partial result asks for, and a LLaMA attention + FFN block on two devices.

use rgml::meta::{propagate, propagate_graph, Propagation, Reduce, Segment, SplitState};
use rgml::{Context, DType, Error, Graph, OpKind, RopeMode, RopeParams, TensorId};
use std::collections::HashMap;

use SplitState::{Mirrored, Partial};

fn split(axis: usize, sizes: &[usize]) -> SplitState {
    SplitState::axis(axis, sizes.to_vec())
}

fn state(p: rgml::Result<Propagation>) -> SplitState {
    let p = p.expect("a rule applies");
    assert!(p.reduce.is_empty(), "unexpected reduce {:?}", p.reduce);
    p.state
}

fn unsupported(r: rgml::Result<Propagation>, op: OpKind) {
    match r {
        Err(Error::UnsupportedSplit { op: got, why }) => {
            assert_eq!(got, op, "{why}");
            assert!(!why.is_empty());
        }
        other => panic!("expected UnsupportedSplit for {op}, got {other:?}"),
    }
}

fn f32(ctx: &mut Context, dims: &[usize]) -> TensorId {
    ctx.new_tensor(DType::F32, dims).unwrap()
}

#[test]
fn mul_mat_rules() {
    let mut ctx = Context::new();
    let w = f32(&mut ctx, &[8, 6]);
    let x = f32(&mut ctx, &[8, 3]);
    let y = ctx.mul_mat(w, x).unwrap();
    // Output rows.
    assert_eq!(
        state(propagate(&ctx, y, &[split(1, &[4, 2]), Mirrored], 2)),
        split(0, &[4, 2])
    );
    // Contraction: partial sums, only when both sides agree.
    assert_eq!(
        state(propagate(
            &ctx,
            y,
            &[split(0, &[4, 4]), split(0, &[4, 4])],
            2
        )),
        Partial
    );
    unsupported(
        propagate(&ctx, y, &[split(0, &[4, 4]), split(0, &[2, 6])], 2),
        OpKind::MulMat,
    );
    unsupported(
        propagate(&ctx, y, &[split(0, &[4, 4]), Mirrored], 2),
        OpKind::MulMat,
    );
    // Columns of b.
    assert_eq!(
        state(propagate(&ctx, y, &[Mirrored, split(1, &[1, 2])], 2)),
        split(1, &[1, 2])
    );
    assert_eq!(
        state(propagate(&ctx, y, &[Mirrored, Mirrored], 2)),
        Mirrored
    );
    // Linear in each operand: a partial b times mirrored weights stays partial.
    assert_eq!(state(propagate(&ctx, y, &[Mirrored, Partial], 2)), Partial);
    let p = propagate(&ctx, y, &[Partial, Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![0, 1]));
    let p = propagate(&ctx, y, &[split(1, &[3, 3]), Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (split(0, &[3, 3]), vec![1]));
    // A state that does not fit its tensor is rejected before any rule.
    assert!(matches!(
        propagate(&ctx, y, &[split(1, &[4, 4]), Mirrored], 2),
        Err(Error::InvalidSplit(_))
    ));
    assert!(propagate(&ctx, y, &[Mirrored], 2).is_err());
}

#[test]
fn fused_qkv_segments_survive_mul_mat() {
    let mut ctx = Context::new();
    // Q 8 rows, K 4, V 4, each split over 2 devices on its own.
    let wqkv = f32(&mut ctx, &[16, 16]);
    let x = f32(&mut ctx, &[16, 3]);
    let y = ctx.mul_mat(wqkv, x).unwrap();
    let segments = vec![
        Segment {
            sizes: vec![4, 4],
            repeat: 1,
        },
        Segment {
            sizes: vec![2, 2],
            repeat: 2,
        },
    ];
    let w_state = SplitState::Axis {
        axis: 1,
        segments: segments.clone(),
    };
    let out = state(propagate(&ctx, y, &[w_state, Mirrored], 2));
    assert_eq!(out, SplitState::Axis { axis: 0, segments });
    assert_eq!(out.local_shape(ctx[y].ne, 0), [8, 3, 1, 1]);
}

#[test]
fn attention_mul_mat_with_grouped_heads() {
    let mut ctx = Context::new();
    let k = f32(&mut ctx, &[4, 8, 2]); // [head_dim, n_kv, kv heads]
    let q = f32(&mut ctx, &[4, 3, 6]); // [head_dim, n_tokens, heads]: 3 per kv head
    let kq = ctx.mul_mat(k, q).unwrap();
    assert_eq!(
        state(propagate(
            &ctx,
            kq,
            &[split(2, &[1, 1]), split(2, &[3, 3])],
            2
        )),
        split(2, &[3, 3])
    );
    // One device holds no head at all.
    assert_eq!(
        state(propagate(
            &ctx,
            kq,
            &[split(2, &[2, 0]), split(2, &[6, 0])],
            2
        )),
        split(2, &[6, 0])
    );
    // Query heads not matching their kv heads.
    unsupported(
        propagate(&ctx, kq, &[split(2, &[1, 1]), split(2, &[4, 2])], 2),
        OpKind::MulMat,
    );
    // A mirrored `a` broadcasts only when it has one matrix.
    unsupported(
        propagate(&ctx, kq, &[Mirrored, split(2, &[3, 3])], 2),
        OpKind::MulMat,
    );
    let k1 = f32(&mut ctx, &[4, 8, 1]);
    let kq1 = ctx.mul_mat(k1, q).unwrap();
    assert_eq!(
        state(propagate(&ctx, kq1, &[Mirrored, split(2, &[3, 3])], 2)),
        split(2, &[3, 3])
    );
    // Split a with mirrored b would need a slice of b.
    unsupported(
        propagate(&ctx, kq, &[split(2, &[1, 1]), Mirrored], 2),
        OpKind::MulMat,
    );
}

#[test]
fn elementwise_binary_rules() {
    let mut ctx = Context::new();
    let a = f32(&mut ctx, &[6, 4]);
    let b = f32(&mut ctx, &[6, 4]);
    let row = f32(&mut ctx, &[6, 1]);
    let col = f32(&mut ctx, &[1, 4]);
    let add = ctx.add(a, b).unwrap();
    let add_row = ctx.add(a, row).unwrap();
    let mul_col = ctx.mul(a, col).unwrap();
    let mul = ctx.mul(a, b).unwrap();
    let div = ctx.div(a, b).unwrap();
    let sub = ctx.sub(a, b).unwrap();

    let s1 = split(1, &[3, 1]);
    assert_eq!(
        state(propagate(&ctx, add, &[s1.clone(), s1.clone()], 2)),
        s1
    );
    // Broadcast along the split axis: the mirrored side has extent 1 there.
    assert_eq!(
        state(propagate(&ctx, add_row, &[s1.clone(), Mirrored], 2)),
        s1
    );
    let s0 = split(0, &[2, 4]);
    assert_eq!(
        state(propagate(&ctx, mul_col, &[s0.clone(), Mirrored], 2)),
        s0
    );
    // Not local: a full-size mirrored operand against a split one, either way round.
    unsupported(
        propagate(&ctx, add, &[s1.clone(), Mirrored], 2),
        OpKind::Add,
    );
    unsupported(
        propagate(&ctx, add, &[Mirrored, s1.clone()], 2),
        OpKind::Add,
    );
    unsupported(
        propagate(&ctx, add, &[s1.clone(), split(1, &[2, 2])], 2),
        OpKind::Add,
    );
    unsupported(
        propagate(&ctx, add, &[s1.clone(), s0.clone()], 2),
        OpKind::Add,
    );

    // Partial sums.
    assert_eq!(state(propagate(&ctx, add, &[Partial, Partial], 2)), Partial);
    assert_eq!(state(propagate(&ctx, sub, &[Partial, Partial], 2)), Partial);
    assert_eq!(
        state(propagate(&ctx, mul, &[Partial, Mirrored], 2)),
        Partial
    );
    assert_eq!(
        state(propagate(&ctx, mul, &[Mirrored, Partial], 2)),
        Partial
    );
    assert_eq!(
        state(propagate(&ctx, div, &[Partial, Mirrored], 2)),
        Partial
    );
    // The residual: partial + mirrored would add the mirrored term once per device.
    let p = propagate(&ctx, add, &[Partial, Mirrored], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![0]));
    let p = propagate(&ctx, add, &[Mirrored, Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![1]));
    let p = propagate(&ctx, div, &[Mirrored, Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![1]));
    let p = propagate(&ctx, mul, &[Partial, Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![0, 1]));
    // Reduced, then the ordinary rule applies.
    let p = propagate(&ctx, add_row, &[s1.clone(), Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (s1, vec![1]));
}

#[test]
fn per_element_and_per_row_rules() {
    let mut ctx = Context::new();
    let a = f32(&mut ctx, &[8, 4, 2]);
    let b = f32(&mut ctx, &[8, 4, 2]);
    let silu = ctx.silu(a).unwrap();
    let scale = ctx.scale(a, 0.5).unwrap();
    let scale_bias = ctx.scale_bias(a, 0.5, 1.0).unwrap();
    let swiglu = ctx.swiglu(a, b).unwrap();
    let norm = ctx.rms_norm(a, 1e-5).unwrap();
    let norm2 = ctx.norm(a, 1e-5).unwrap();
    let diag = ctx.diag_mask_inf(a, 0).unwrap();
    let cont = ctx.cont(a).unwrap();
    let dup = ctx.dup(a).unwrap();

    let s0 = split(0, &[4, 4]);
    let s1 = split(1, &[1, 3]);
    let s2 = split(2, &[1, 1]);
    for id in [silu, scale, cont, dup] {
        assert_eq!(state(propagate(&ctx, id, std::slice::from_ref(&s0), 2)), s0);
    }
    assert_eq!(state(propagate(&ctx, scale, &[Partial], 2)), Partial);
    assert_eq!(state(propagate(&ctx, cont, &[Partial], 2)), Partial);
    for id in [silu, scale_bias, norm, diag] {
        let p = propagate(&ctx, id, &[Partial], 2).unwrap();
        assert_eq!((p.state, p.reduce), (Mirrored, vec![0]), "{:?}", ctx[id].op);
    }
    assert_eq!(
        state(propagate(&ctx, swiglu, &[s1.clone(), s1.clone()], 2)),
        s1
    );
    unsupported(
        propagate(&ctx, swiglu, &[s1.clone(), Mirrored], 2),
        OpKind::Swiglu,
    );
    let p = propagate(&ctx, swiglu, &[Partial, Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![0, 1]));

    unsupported(
        propagate(&ctx, norm, std::slice::from_ref(&s0), 2),
        OpKind::RmsNorm,
    );
    unsupported(
        propagate(&ctx, norm2, std::slice::from_ref(&s0), 2),
        OpKind::Norm,
    );
    assert_eq!(
        state(propagate(&ctx, norm, std::slice::from_ref(&s1), 2)),
        s1
    );
    unsupported(
        propagate(&ctx, diag, std::slice::from_ref(&s0), 2),
        OpKind::DiagMaskInf,
    );
    unsupported(
        propagate(&ctx, diag, std::slice::from_ref(&s1), 2),
        OpKind::DiagMaskInf,
    );
    assert_eq!(
        state(propagate(&ctx, diag, std::slice::from_ref(&s2), 2)),
        s2
    );
}

#[test]
fn rope_soft_max_get_rows_set_rows_argmax_concat() {
    let mut ctx = Context::new();
    // ROPE: [head_dim, heads, tokens].
    let q = f32(&mut ctx, &[4, 6, 3]);
    let pos = ctx.new_tensor(DType::I32, &[3]).unwrap();
    let rope = ctx
        .rope(q, pos, RopeParams::new(RopeMode::Normal, 4, 10000.0))
        .unwrap();
    let heads = split(1, &[4, 2]);
    assert_eq!(
        state(propagate(&ctx, rope, &[heads.clone(), Mirrored], 2)),
        heads
    );
    assert_eq!(
        state(propagate(&ctx, rope, &[Partial, Mirrored], 2)),
        Partial
    );
    unsupported(
        propagate(&ctx, rope, &[split(0, &[2, 2]), Mirrored], 2),
        OpKind::Rope,
    );
    unsupported(
        propagate(&ctx, rope, &[split(2, &[2, 1]), split(0, &[2, 1])], 2),
        OpKind::Rope,
    );
    // ROPE with frequency factors: a small weight every device reads whole.
    let ff = f32(&mut ctx, &[2]);
    let rope_ff = ctx
        .rope_ext(
            q,
            pos,
            Some(ff),
            RopeParams::new(RopeMode::Normal, 4, 10000.0),
        )
        .unwrap();
    assert_eq!(
        state(propagate(
            &ctx,
            rope_ff,
            &[heads.clone(), Mirrored, Mirrored],
            2
        )),
        heads
    );
    assert_eq!(
        state(propagate(&ctx, rope_ff, &[Partial, Mirrored, Mirrored], 2)),
        Partial
    );
    // Partial factors are summed first (the angle is not linear in them).
    let p = propagate(&ctx, rope_ff, &[heads.clone(), Mirrored, Partial], 2).unwrap();
    assert_eq!((p.state, p.reduce), (heads.clone(), vec![2]));
    unsupported(
        propagate(
            &ctx,
            rope_ff,
            &[heads.clone(), Mirrored, split(0, &[1, 1])],
            2,
        ),
        OpKind::Rope,
    );

    // SOFT_MAX over [n_kv, tokens, heads] with a mask broadcast over heads.
    let kq = f32(&mut ctx, &[8, 3, 4]);
    let mask = f32(&mut ctx, &[8, 3]);
    let sm = ctx.soft_max_ext(kq, Some(mask), 0.5, 0.0).unwrap();
    let alibi = ctx.soft_max_ext(kq, Some(mask), 0.5, 8.0).unwrap();
    let plain = ctx.soft_max(kq).unwrap();
    let h = split(2, &[2, 2]);
    assert_eq!(state(propagate(&ctx, sm, &[h.clone(), Mirrored], 2)), h);
    assert_eq!(
        state(propagate(&ctx, plain, std::slice::from_ref(&h), 2)),
        h
    );
    unsupported(
        propagate(&ctx, sm, &[split(0, &[4, 4]), Mirrored], 2),
        OpKind::SoftMax,
    );
    // The mask is full size along axis 1: it would have to be split like src0.
    unsupported(
        propagate(&ctx, sm, &[split(1, &[2, 1]), Mirrored], 2),
        OpKind::SoftMax,
    );
    assert_eq!(
        state(propagate(
            &ctx,
            sm,
            &[split(1, &[2, 1]), split(1, &[2, 1])],
            2
        )),
        split(1, &[2, 1])
    );
    unsupported(
        propagate(&ctx, alibi, &[h.clone(), Mirrored], 2),
        OpKind::SoftMax,
    );
    let p = propagate(&ctx, sm, &[Partial, Mirrored], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![0]));

    // GET_ROWS.
    let table = f32(&mut ctx, &[8, 10]);
    let idx = ctx.new_tensor(DType::I32, &[3]).unwrap();
    let rows = ctx.get_rows(table, idx).unwrap();
    assert_eq!(
        state(propagate(&ctx, rows, &[split(0, &[4, 4]), Mirrored], 2)),
        split(0, &[4, 4])
    );
    assert_eq!(
        state(propagate(&ctx, rows, &[Mirrored, Mirrored], 2)),
        Mirrored
    );
    assert_eq!(
        state(propagate(&ctx, rows, &[Partial, Mirrored], 2)),
        Partial
    );
    assert_eq!(
        state(propagate(&ctx, rows, &[Mirrored, split(0, &[2, 1])], 2)),
        split(1, &[2, 1])
    );
    unsupported(
        propagate(&ctx, rows, &[split(1, &[5, 5]), Mirrored], 2),
        OpKind::GetRows,
    );
    let p = propagate(&ctx, rows, &[Mirrored, Partial], 2).unwrap();
    assert_eq!(p.reduce, vec![1]);

    // SET_ROWS into a cache split on axis 0.
    let cache = f32(&mut ctx, &[8, 10]);
    let new = f32(&mut ctx, &[8, 3]);
    let at = ctx.new_tensor(DType::I32, &[3]).unwrap();
    let set = ctx.set_rows(cache, new, at).unwrap();
    let c0 = split(0, &[4, 4]);
    assert_eq!(
        state(propagate(&ctx, set, &[c0.clone(), c0.clone(), Mirrored], 2)),
        c0
    );
    unsupported(
        propagate(&ctx, set, &[c0.clone(), Mirrored, Mirrored], 2),
        OpKind::SetRows,
    );
    unsupported(
        propagate(
            &ctx,
            set,
            &[split(1, &[5, 5]), split(1, &[2, 1]), Mirrored],
            2,
        ),
        OpKind::SetRows,
    );
    let p = propagate(&ctx, set, &[Mirrored, Partial, Mirrored], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![1]));

    // ARGMAX.
    let logits = f32(&mut ctx, &[10, 4]);
    let am = ctx.argmax(logits).unwrap();
    assert_eq!(
        state(propagate(&ctx, am, &[split(1, &[1, 3])], 2)),
        split(0, &[1, 3])
    );
    unsupported(propagate(&ctx, am, &[split(0, &[5, 5])], 2), OpKind::Argmax);

    // CONCAT along the split axis: a's segments then b's.
    let x = f32(&mut ctx, &[4, 3]);
    let y = f32(&mut ctx, &[4, 5]);
    let cat = ctx.concat(x, y, 1).unwrap();
    let out = state(propagate(
        &ctx,
        cat,
        &[split(1, &[2, 1]), split(1, &[2, 3])],
        2,
    ));
    assert_eq!(
        out,
        SplitState::Axis {
            axis: 1,
            segments: vec![
                Segment {
                    sizes: vec![2, 1],
                    repeat: 1
                },
                Segment {
                    sizes: vec![2, 3],
                    repeat: 1
                }
            ]
        }
    );
    assert_eq!(out.local_shape(ctx[cat].ne, 1), [4, 4, 1, 1]);
    assert_eq!(
        state(propagate(
            &ctx,
            cat,
            &[split(0, &[1, 3]), split(0, &[1, 3])],
            2
        )),
        split(0, &[1, 3])
    );
    assert_eq!(state(propagate(&ctx, cat, &[Partial, Partial], 2)), Partial);
    unsupported(
        propagate(&ctx, cat, &[split(0, &[1, 3]), Mirrored], 2),
        OpKind::Concat,
    );
}

#[test]
fn repeat_keeps_an_untiled_split_and_partial_sums() {
    let mut ctx = Context::new();
    // llama.cpp's per-expert scales: [1, n_expert, 1] tiled over 5 tokens.
    let s = f32(&mut ctx, &[1, 8, 1]);
    let r = ctx.repeat(s, &[1, 8, 5]).unwrap();
    assert_eq!(
        state(propagate(&ctx, r, &[split(1, &[5, 3])], 2)),
        split(1, &[5, 3])
    );
    assert_eq!(state(propagate(&ctx, r, &[Mirrored], 2)), Mirrored);
    // Linear: a partial source gives partial tiles.
    assert_eq!(state(propagate(&ctx, r, &[Partial], 2)), Partial);
    // Tiling along the split axis would interleave the devices' slices.
    let x = f32(&mut ctx, &[4, 6]);
    let tiled = ctx.repeat(x, &[8, 12]).unwrap();
    unsupported(
        propagate(&ctx, tiled, &[split(1, &[3, 3])], 2),
        OpKind::Repeat,
    );
    assert_eq!(state(propagate(&ctx, tiled, &[Mirrored], 2)), Mirrored);
    let rows = ctx.repeat(x, &[4, 12]).unwrap();
    assert_eq!(
        state(propagate(&ctx, rows, &[split(0, &[1, 3])], 2)),
        split(0, &[1, 3])
    );
}

#[test]
fn ssm_conv_splits_by_channel_and_delta_net_stays_whole() {
    let mut ctx = Context::new();
    let sx = f32(&mut ctx, &[6, 8, 2]);
    let c = f32(&mut ctx, &[4, 8]);
    let y = ctx.ssm_conv(sx, c).unwrap();
    // Channels split alike on both sides: the result's channels (axis 0) are split so.
    assert_eq!(
        state(propagate(
            &ctx,
            y,
            &[split(1, &[5, 3]), split(1, &[5, 3])],
            2
        )),
        split(0, &[5, 3])
    );
    assert_eq!(
        state(propagate(&ctx, y, &[Mirrored, Mirrored], 2)),
        Mirrored
    );
    unsupported(
        propagate(&ctx, y, &[split(1, &[4, 4]), split(1, &[5, 3])], 2),
        OpKind::SsmConv,
    );
    unsupported(
        propagate(&ctx, y, &[split(1, &[4, 4]), Mirrored], 2),
        OpKind::SsmConv,
    );
    let p = propagate(&ctx, y, &[Partial, Mirrored], 2).unwrap();
    assert_eq!((p.state, p.reduce), (Mirrored, vec![0]));

    let shapes: [&[usize]; 6] = [
        &[8, 2, 3, 1],
        &[8, 2, 3, 1],
        &[8, 2, 3, 1],
        &[1, 2, 3, 1],
        &[1, 2, 3, 1],
        &[8, 8, 2, 1],
    ];
    let src: Vec<TensorId> = shapes.iter().map(|ne| f32(&mut ctx, ne)).collect();
    let net = ctx
        .gated_delta_net(src[0], src[1], src[2], src[3], src[4], src[5], 1)
        .unwrap();
    let mirrored = vec![Mirrored; 6];
    assert_eq!(state(propagate(&ctx, net, &mirrored, 2)), Mirrored);
    let mut by_head = vec![Mirrored; 6];
    by_head[2] = split(1, &[1, 1]);
    unsupported(propagate(&ctx, net, &by_head, 2), OpKind::GatedDeltaNet);
}

#[test]
fn view_ops_remap_the_axis() {
    let mut ctx = Context::new();
    let a = f32(&mut ctx, &[576, 3]);
    // 9 heads of 64.
    let heads = ctx.reshape(a, &[64, 9, 3]).unwrap();
    assert_eq!(
        state(propagate(&ctx, heads, &[split(0, &[320, 256])], 2)),
        split(1, &[5, 4])
    );
    unsupported(
        propagate(&ctx, heads, &[split(0, &[300, 276])], 2),
        OpKind::Reshape,
    );
    // A split of the token axis passes through the head reshape.
    assert_eq!(
        state(propagate(&ctx, heads, &[split(1, &[2, 1])], 2)),
        split(2, &[2, 1])
    );
    assert_eq!(state(propagate(&ctx, heads, &[Partial], 2)), Partial);
    // Merging the rows with the token axis cuts across a split of either.
    let flat = ctx.reshape(a, &[576 * 3]).unwrap();
    unsupported(
        propagate(&ctx, flat, &[split(0, &[320, 256])], 2),
        OpKind::Reshape,
    );
    assert_eq!(
        state(propagate(&ctx, flat, &[split(1, &[2, 1])], 2)),
        split(0, &[1152, 576])
    );

    // PERMUTE and TRANSPOSE move the axis.
    let p = ctx.permute(heads, [0, 2, 1, 3]).unwrap();
    assert_eq!(
        state(propagate(&ctx, p, &[split(1, &[5, 4])], 2)),
        split(2, &[5, 4])
    );
    let t = ctx.transpose(a).unwrap();
    assert_eq!(
        state(propagate(&ctx, t, &[split(0, &[320, 256])], 2)),
        split(1, &[320, 256])
    );
    // CONT with a shape merges heads back into rows.
    // [64, tokens, heads] flattened to [576, 3] mixes tokens into the rows: a token split
    // cannot follow.
    let c = ctx.cont_shape(p, &[576, 3]).unwrap();
    unsupported(propagate(&ctx, c, &[split(1, &[2, 1])], 2), OpKind::Cont);
    // Heads (axis 2, 192 elements each) become columns of 576: three heads per column.
    assert_eq!(
        state(propagate(&ctx, c, &[split(2, &[6, 3])], 2)),
        split(1, &[2, 1])
    );
    unsupported(propagate(&ctx, c, &[split(2, &[5, 4])], 2), OpKind::Cont);
    let merged = ctx.cont_shape(heads, &[576, 3]).unwrap();
    assert_eq!(
        state(propagate(&ctx, merged, &[split(1, &[5, 4])], 2)),
        split(0, &[320, 256])
    );

    // VIEW: whole axis kept (a range of tokens) is fine; a range of the split axis is not.
    let row = ctx[a].nb[1];
    let last = ctx.view(a, &[576, 1], &[row], 2 * row).unwrap();
    assert_eq!(
        state(propagate(&ctx, last, &[split(0, &[320, 256])], 2)),
        split(0, &[320, 256])
    );
    unsupported(propagate(&ctx, last, &[split(1, &[2, 1])], 2), OpKind::View);
    let half = ctx.view(a, &[288, 3], &[row], 0).unwrap();
    unsupported(
        propagate(&ctx, half, &[split(0, &[320, 256])], 2),
        OpKind::View,
    );
    let shifted = ctx.view(a, &[576, 2], &[row], 4).unwrap();
    unsupported(
        propagate(&ctx, shifted, &[split(0, &[320, 256])], 2),
        OpKind::View,
    );
    // A view of a non-contiguous split tensor.
    let vt = ctx.view(t, &[3], &[], 0).unwrap();
    unsupported(
        propagate(&ctx, vt, &[split(1, &[320, 256])], 2),
        OpKind::View,
    );
    assert_eq!(state(propagate(&ctx, vt, &[Mirrored], 2)), Mirrored);
}

/// Weights and cache of one LLaMA layer with grouped-query attention.
struct Block {
    ctx: Context,
    graph: Graph,
    leaf: HashMap<TensorId, SplitState>,
    names: HashMap<&'static str, TensorId>,
}

const N_EMBD: usize = 16;
const HD: usize = 4;
const N_HEAD: usize = 4;
const N_HEAD_KV: usize = 2;
const N_EMBD_KV: usize = HD * N_HEAD_KV;
const N_FF: usize = 12;
const CELLS: usize = 8;
const N: usize = 3;
const N_PAST: usize = 5;
const VOCAB: usize = 10;

fn llama_block() -> Block {
    let mut ctx = Context::new();
    let mut leaf = HashMap::new();
    let mut names = HashMap::new();
    let f16 = 2;
    let n_kv = N_PAST + N;
    let mut w = |ctx: &mut Context, dtype, dims: &[usize], s: SplitState| {
        let id = ctx.new_tensor(dtype, dims).unwrap();
        leaf.insert(id, s);
        id
    };
    // Split by output rows; the contraction split of wo and ffn_down gives partial sums.
    let tok_embd = w(&mut ctx, DType::F32, &[N_EMBD, VOCAB], Mirrored);
    let attn_norm = w(&mut ctx, DType::F32, &[N_EMBD], Mirrored);
    let wq = w(&mut ctx, DType::F32, &[N_EMBD, N_EMBD], split(1, &[8, 8]));
    let wk = w(
        &mut ctx,
        DType::F32,
        &[N_EMBD, N_EMBD_KV],
        split(1, &[4, 4]),
    );
    let wv = w(
        &mut ctx,
        DType::F32,
        &[N_EMBD, N_EMBD_KV],
        split(1, &[4, 4]),
    );
    let wo = w(&mut ctx, DType::F32, &[N_EMBD, N_EMBD], split(0, &[8, 8]));
    let ffn_norm = w(&mut ctx, DType::F32, &[N_EMBD], Mirrored);
    let gate_w = w(&mut ctx, DType::F32, &[N_EMBD, N_FF], split(1, &[6, 6]));
    let up_w = w(&mut ctx, DType::F32, &[N_EMBD, N_FF], split(1, &[6, 6]));
    let down_w = w(&mut ctx, DType::F32, &[N_FF, N_EMBD], split(0, &[6, 6]));
    let out_norm = w(&mut ctx, DType::F32, &[N_EMBD], Mirrored);
    let output = w(&mut ctx, DType::F32, &[N_EMBD, VOCAB], Mirrored);
    // KV cache split by kv heads: K rows hold heads, V is stored transposed.
    let k_cache = w(&mut ctx, DType::F16, &[N_EMBD_KV, CELLS], split(0, &[4, 4]));
    let v_cache = w(&mut ctx, DType::F16, &[CELLS, N_EMBD_KV], split(1, &[4, 4]));
    let tokens = ctx.new_tensor(DType::I32, &[N]).unwrap();
    let positions = ctx.new_tensor(DType::I32, &[N]).unwrap();
    let mask = ctx.new_tensor(DType::F32, &[n_kv, N]).unwrap();

    let c = &mut ctx;
    let x = c.get_rows(tok_embd, tokens).unwrap();
    let cur = c.rms_norm(x, 1e-5).unwrap();
    let cur = c.mul(cur, attn_norm).unwrap();
    let q = c.mul_mat(wq, cur).unwrap();
    let k = c.mul_mat(wk, cur).unwrap();
    let v = c.mul_mat(wv, cur).unwrap();
    let rope = RopeParams::new(RopeMode::Normal, HD, 10000.0);
    let q3 = c.reshape(q, &[HD, N_HEAD, N]).unwrap();
    let q_rope = c.rope(q3, positions, rope).unwrap();
    let k3 = c.reshape(k, &[HD, N_HEAD_KV, N]).unwrap();
    let k_rope = c.rope(k3, positions, rope).unwrap();
    let k_dst = c
        .view(
            k_cache,
            &[N_EMBD_KV, N],
            &[N_EMBD_KV * f16],
            N_PAST * N_EMBD_KV * f16,
        )
        .unwrap();
    let k_flat = c.reshape(k_rope, &[N_EMBD_KV, N]).unwrap();
    let k_store = c.cpy(k_flat, k_dst).unwrap();
    let v_dst = c
        .view(v_cache, &[N, N_EMBD_KV], &[CELLS * f16], N_PAST * f16)
        .unwrap();
    let v_t = c.transpose(v).unwrap();
    let v_store = c.cpy(v_t, v_dst).unwrap();
    let k_all = c
        .view(
            k_cache,
            &[HD, N_HEAD_KV, n_kv],
            &[HD * f16, N_EMBD_KV * f16],
            0,
        )
        .unwrap();
    let k_perm = c.permute(k_all, [0, 2, 1, 3]).unwrap();
    let q_perm = c.permute(q_rope, [0, 2, 1, 3]).unwrap();
    let kq = c.mul_mat(k_perm, q_perm).unwrap();
    let kq_sm = c.soft_max_ext(kq, Some(mask), 0.5, 0.0).unwrap();
    let v_all = c
        .view(
            v_cache,
            &[n_kv, HD, N_HEAD_KV],
            &[CELLS * f16, CELLS * f16 * HD],
            0,
        )
        .unwrap();
    let kqv = c.mul_mat(v_all, kq_sm).unwrap();
    let kqv_perm = c.permute(kqv, [0, 2, 1, 3]).unwrap();
    let attn_in = c.cont_shape(kqv_perm, &[N_EMBD, N]).unwrap();
    let attn = c.mul_mat(wo, attn_in).unwrap();
    let x_attn = c.add(attn, x).unwrap();
    let cur = c.rms_norm(x_attn, 1e-5).unwrap();
    let ffn_in = c.mul(cur, ffn_norm).unwrap();
    let gate = c.mul_mat(gate_w, ffn_in).unwrap();
    let up = c.mul_mat(up_w, ffn_in).unwrap();
    let act = c.swiglu(gate, up).unwrap();
    let down = c.mul_mat(down_w, act).unwrap();
    let x_out = c.add(down, x_attn).unwrap();
    let out_n = c.rms_norm(x_out, 1e-5).unwrap();
    let out_n = c.mul(out_n, out_norm).unwrap();
    let logits = c.mul_mat(output, out_n).unwrap();
    c.set_output(logits).unwrap();

    let mut graph = Graph::new();
    graph.expand(c, k_store).unwrap();
    graph.expand(c, v_store).unwrap();
    graph.expand(c, logits).unwrap();
    for (name, id) in [
        ("x", x),
        ("cur", cur),
        ("q", q),
        ("k", k),
        ("v", v),
        ("q_rope", q_rope),
        ("k_rope", k_rope),
        ("k_dst", k_dst),
        ("k_flat", k_flat),
        ("k_store", k_store),
        ("v_dst", v_dst),
        ("v_t", v_t),
        ("v_store", v_store),
        ("k_all", k_all),
        ("k_perm", k_perm),
        ("q_perm", q_perm),
        ("kq", kq),
        ("kq_sm", kq_sm),
        ("v_all", v_all),
        ("kqv", kqv),
        ("kqv_perm", kqv_perm),
        ("attn_in", attn_in),
        ("attn", attn),
        ("x_attn", x_attn),
        ("ffn_in", ffn_in),
        ("gate", gate),
        ("up", up),
        ("act", act),
        ("down", down),
        ("x_out", x_out),
        ("out_n", out_n),
        ("logits", logits),
    ] {
        names.insert(name, id);
    }
    Block {
        ctx,
        graph,
        leaf,
        names,
    }
}

#[test]
fn llama_block_on_two_devices() {
    let b = llama_block();
    let g = propagate_graph(&b.ctx, &b.graph, |id| b.leaf.get(&id).cloned(), 2).unwrap();
    let expect = [
        ("x", Mirrored),
        ("cur", Mirrored),
        ("q", split(0, &[8, 8])),
        ("k", split(0, &[4, 4])),
        ("v", split(0, &[4, 4])),
        ("q_rope", split(1, &[2, 2])),
        ("k_rope", split(1, &[1, 1])),
        ("k_dst", split(0, &[4, 4])),
        ("k_flat", split(0, &[4, 4])),
        ("k_store", split(0, &[4, 4])),
        ("v_dst", split(1, &[4, 4])),
        ("v_t", split(1, &[4, 4])),
        ("v_store", split(1, &[4, 4])),
        ("k_all", split(1, &[1, 1])),
        ("k_perm", split(2, &[1, 1])),
        ("q_perm", split(2, &[2, 2])),
        ("kq", split(2, &[2, 2])),
        ("kq_sm", split(2, &[2, 2])),
        ("v_all", split(2, &[1, 1])),
        ("kqv", split(2, &[2, 2])),
        ("kqv_perm", split(1, &[2, 2])),
        ("attn_in", split(0, &[8, 8])),
        ("attn", Partial),
        ("x_attn", Mirrored),
        ("ffn_in", Mirrored),
        ("gate", split(0, &[6, 6])),
        ("up", split(0, &[6, 6])),
        ("act", split(0, &[6, 6])),
        ("down", Partial),
        ("x_out", Mirrored),
        ("out_n", Mirrored),
        ("logits", Mirrored),
    ];
    for (name, want) in expect {
        assert_eq!(g.state(b.names[name]), Some(&want), "{name}");
    }
    // Exactly two cuts: the attention output before the residual ADD, the FFN output before
    // the next residual ADD.
    assert_eq!(
        g.reduces,
        vec![
            Reduce {
                tensor: b.names["attn"],
                before: Some(b.names["x_attn"]),
            },
            Reduce {
                tensor: b.names["down"],
                before: Some(b.names["x_out"]),
            },
        ]
    );
    assert!(g.is_reduced(b.names["attn"]) && !g.is_reduced(b.names["q"]));
    // Every state fits its tensor, and per-device slices cover the heads evenly.
    for (&id, s) in &g.states {
        s.validate(b.ctx[id].ne, 2).unwrap();
    }
    assert_eq!(
        g.state(b.names["kq"])
            .unwrap()
            .local_shape(b.ctx[b.names["kq"]].ne, 1),
        [N_PAST + N, N, 2, 1]
    );
}

#[test]
fn llama_block_uneven_three_devices_and_errors() {
    let mut b = llama_block();
    // 3 devices, uneven heads: wq 2/1/1 heads, kv 1/0/1 heads cannot serve wq's grouping
    // (device 1 holds a query head but no kv head).
    let ids: Vec<TensorId> = b.leaf.keys().copied().collect();
    for id in ids {
        let s = match b.leaf[&id].clone() {
            SplitState::Axis { axis, .. } => {
                let n = b.ctx[id].ne[axis];
                let sizes = match n {
                    16 => vec![8, 4, 4],
                    8 => vec![4, 0, 4],
                    12 => vec![4, 4, 4],
                    _ => unreachable!("{n}"),
                };
                split(axis, &sizes)
            }
            other => other,
        };
        b.leaf.insert(id, s);
    }
    let err = propagate_graph(&b.ctx, &b.graph, |id| b.leaf.get(&id).cloned(), 3).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedSplit {
                op: OpKind::MulMat,
                ..
            }
        ),
        "{err}"
    );

    // Query heads follow their kv heads (2 per kv head): 4/0/4 rows of wq with 4/0/4 of wk.
    for (id, s) in b.leaf.iter_mut() {
        if let SplitState::Axis { axis, .. } = s {
            if b.ctx[*id].ne[*axis] == 16 {
                *s = split(*axis, &[8, 0, 8]);
            }
        }
    }
    let g = propagate_graph(&b.ctx, &b.graph, |id| b.leaf.get(&id).cloned(), 3).unwrap();
    assert_eq!(g.state(b.names["kq"]), Some(&split(2, &[2, 0, 2])));
    assert_eq!(g.state(b.names["act"]), Some(&split(0, &[4, 4, 4])));
    assert_eq!(g.reduces.len(), 2);

    // A leaf state that does not fit its tensor.
    let bad = propagate_graph(&b.ctx, &b.graph, |_| Some(split(0, &[1, 1, 1])), 3);
    assert!(matches!(bad, Err(Error::InvalidSplit(_))));
}

#[test]
fn partial_output_is_reduced_at_the_end() {
    let mut ctx = Context::new();
    let w = f32(&mut ctx, &[8, 4]);
    let x = f32(&mut ctx, &[8, 2]);
    let y = ctx.mul_mat(w, x).unwrap();
    let z = ctx.scale(y, 2.0).unwrap();
    let graph = Graph::build(&mut ctx, &[z]).unwrap();
    let g = propagate_graph(
        &ctx,
        &graph,
        |id| (id == w || id == x).then(|| split(0, &[4, 4])),
        2,
    )
    .unwrap();
    assert_eq!(g.state(y), Some(&Partial));
    assert_eq!(g.state(z), Some(&Partial));
    assert_eq!(
        g.reduces,
        vec![Reduce {
            tensor: z,
            before: None
        }]
    );
}

/// The projections split by output rows (bit-exact tensor parallelism): no partial sums; their
/// split inputs and outputs are all-gathered where a node needs them whole, and only computed
/// tensors are ever gathered.
#[test]
fn row_split_projections_gather_their_inputs_and_outputs() {
    let mut b = llama_block();
    let ids: Vec<TensorId> = b.leaf.keys().copied().collect();
    for id in ids {
        let ne = b.ctx[id].ne;
        let projection = (ne[0] == N_EMBD || ne[0] == N_FF)
            && ne[1] == N_EMBD
            && matches!(b.leaf[&id], SplitState::Axis { axis: 0, .. });
        if projection {
            b.leaf.insert(id, split(1, &[4, 12]));
        }
    }
    let g = propagate_graph(&b.ctx, &b.graph, |id| b.leaf.get(&id).cloned(), 2).unwrap();
    assert!(g.reduces.is_empty(), "{:?}", g.reduces);
    let n = |name: &str| b.names[name];
    for (name, want) in [
        ("attn_in", split(0, &[8, 8])),
        ("attn", split(0, &[4, 12])),
        ("x_attn", Mirrored),
        ("act", split(0, &[6, 6])),
        ("down", split(0, &[4, 12])),
        ("x_out", Mirrored),
        ("logits", Mirrored),
    ] {
        assert_eq!(g.state(n(name)), Some(&want), "{name}");
    }
    let gathers: Vec<(TensorId, TensorId)> =
        g.gathers.iter().map(|x| (x.tensor, x.before)).collect();
    assert_eq!(
        gathers,
        vec![
            (n("attn_in"), n("attn")),
            (n("attn"), n("x_attn")),
            (n("act"), n("down")),
            (n("down"), n("x_out")),
        ]
    );
    assert!(g.is_gathered(n("act")) && !g.is_gathered(n("q")));
    for x in &g.gathers {
        assert_ne!(b.ctx[x.tensor].op, rgml::op::Op::None);
    }
}

#[test]
fn leaves_are_never_gathered() {
    // A split weight added to a full-size mirrored input: the weight would have to be
    // gathered, which a leaf never is.
    let mut ctx = Context::new();
    let w = f32(&mut ctx, &[8, 2]);
    let x = f32(&mut ctx, &[8, 2]);
    let y = ctx.add(x, w).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    let err = propagate_graph(&ctx, &graph, |id| (id == w).then(|| split(0, &[4, 4])), 2);
    assert!(
        matches!(
            err,
            Err(Error::UnsupportedSplit {
                op: OpKind::Add,
                ..
            })
        ),
        "{err:?}"
    );
    // The same sum of a computed split tensor (a scaled copy of the weight) gathers that.
    let mut ctx = Context::new();
    let w = f32(&mut ctx, &[8, 2]);
    let x = f32(&mut ctx, &[8, 2]);
    let s = ctx.scale(w, 2.0).unwrap();
    let y = ctx.add(x, s).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    let g = propagate_graph(&ctx, &graph, |id| (id == w).then(|| split(0, &[4, 4])), 2).unwrap();
    assert_eq!(g.state(s), Some(&split(0, &[4, 4])));
    assert_eq!(g.state(y), Some(&Mirrored));
    assert_eq!(g.gathers.len(), 1);
    assert_eq!((g.gathers[0].tensor, g.gathers[0].before), (s, y));
}
