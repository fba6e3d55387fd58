//! Graph allocator properties on a test-only host buffer type: memory reuse below the sum of
//! node sizes without overlapping live tensors, in-place rules, inputs and outputs, several
//! buffer types, reserve / re-reserve, untouched external storage, errors, and chunked
//! allocation (multi-buffers) for a buffer type with a small maximum size.

mod common;

use rgml::alloc::{op_can_inplace, GraphAllocator, TensorAllocator};
use rgml::backend::BufferUsage;
use rgml::{Buffer, BufferTypeRef, Context, DType, Error, Graph, TensorFlags, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

fn buffer_type(name: &str) -> BufferTypeRef {
    common::vec_buffer_type(name, usize::MAX)
}

/// Put `ids` (leafs) into a fresh "weights" buffer, as a model loader would.
fn place_weights(ctx: &mut Context, ids: &[TensorId]) -> Arc<Buffer> {
    let bt = buffer_type("W");
    let size: usize = ids
        .iter()
        .map(|&id| ctx[id].nbytes().div_ceil(32) * 32)
        .sum();
    let buffer = Buffer::alloc(&bt, size).unwrap();
    let mut talloc = TensorAllocator::new(buffer.clone());
    for &id in ids {
        talloc.alloc(ctx, id).unwrap();
    }
    buffer
}

// ---------------------------------------------------------------------------------------------
// Checks.

fn pattern(id: TensorId) -> u8 {
    (id.index() % 250 + 1) as u8
}

/// Whether `t` holds its own bytes in one of `buffers` (not a view, not external).
fn own(ctx: &Context, id: TensorId, buffers: &[u64]) -> bool {
    let t = &ctx[id];
    t.view_src.is_none()
        && t.data
            .as_ref()
            .is_some_and(|d| buffers.contains(&d.buffer.id()))
}

/// Live interval `[first, last]` per tensor, in compute steps: leafs and inputs exist from step
/// 0 (the caller fills them before compute), node `i` is written at step `i + 1`, and a tensor
/// lives until the last step that reads it or a view of it (forever for outputs).
fn lifetimes(ctx: &Context, graph: &Graph) -> HashMap<TensorId, (usize, usize)> {
    let mut life: HashMap<TensorId, (usize, usize)> = HashMap::new();
    for &l in graph.leafs() {
        life.insert(l, (0, 0));
    }
    for (i, &n) in graph.nodes().iter().enumerate() {
        let start = if ctx[n].flags.contains(TensorFlags::INPUT) {
            0
        } else {
            i + 1
        };
        life.insert(n, (start, start));
    }
    for (i, &n) in graph.nodes().iter().enumerate() {
        for &s in &ctx[n].src {
            let root = ctx[s].view_src.unwrap_or(s);
            for t in [s, root] {
                let e = life.entry(t).or_insert((0, 0));
                e.1 = e.1.max(i + 1);
            }
        }
    }
    let ids: Vec<TensorId> = life.keys().copied().collect();
    for id in ids {
        if ctx[id].flags.contains(TensorFlags::OUTPUT) {
            let root = ctx[id].view_src.unwrap_or(id);
            life.get_mut(&root).unwrap().1 = usize::MAX;
            life.get_mut(&id).unwrap().1 = usize::MAX;
        }
    }
    life
}

/// Whether `b` legitimately took over `a`'s memory in place.
fn inplace_pair(ctx: &Context, a: TensorId, b: TensorId) -> bool {
    let tb = &ctx[b];
    op_can_inplace(&tb.op)
        && tb
            .src
            .first()
            .is_some_and(|&s| s == a || ctx[s].view_src == Some(a))
}

/// Every pair of own tensors whose lifetimes overlap uses disjoint bytes (except a node and the
/// src0 it overwrites in place at the step the source dies). Returns the number of pairs checked.
fn check_no_overlap(ctx: &Context, graph: &Graph, buffers: &[u64]) -> usize {
    let life = lifetimes(ctx, graph);
    let tensors: Vec<TensorId> = life
        .keys()
        .copied()
        .filter(|&id| own(ctx, id, buffers) && ctx[id].nbytes() > 0)
        .collect();
    let mut checked = 0;
    for (i, &a) in tensors.iter().enumerate() {
        for &b in &tensors[i + 1..] {
            let (da, db) = (ctx[a].data.as_ref().unwrap(), ctx[b].data.as_ref().unwrap());
            let ((fa, la), (fb, lb)) = (life[&a], life[&b]);
            if fa > lb || fb > la {
                continue;
            }
            checked += 1;
            if da.buffer.id() != db.buffer.id() {
                continue;
            }
            let (ea, eb) = (da.offset + ctx[a].nbytes(), db.offset + ctx[b].nbytes());
            if da.offset >= eb || db.offset >= ea {
                continue;
            }
            let ok = (inplace_pair(ctx, a, b) && fb == la) || (inplace_pair(ctx, b, a) && fa == lb);
            assert!(
                ok,
                "live tensors '{}' {:?} [{}..{}) and '{}' {:?} [{}..{}) overlap",
                ctx[a].name, life[&a], da.offset, ea, ctx[b].name, life[&b], db.offset, eb
            );
        }
    }
    checked
}

/// Run the graph on fake kernels: fill leafs and inputs with a per-tensor byte, then for each
/// node check that every source still holds its producer's byte and write the node's own. At
/// the end, outputs and external leafs (weights) must be intact. Catches any reuse of memory
/// still to be read.
fn simulate(ctx: &Context, graph: &Graph, buffers: &[u64]) {
    let fill = |id: TensorId| {
        let n = ctx[id].nbytes();
        ctx.tensor_set(id, 0, &vec![pattern(id); n]).unwrap();
    };
    let check = |id: TensorId, when: &str| {
        let root = ctx[id].view_src.unwrap_or(id);
        let bytes = ctx.tensor_bytes(root).unwrap();
        assert!(
            bytes.iter().all(|&b| b == pattern(root)),
            "'{}' was overwritten {when}",
            ctx[root].name
        );
    };
    for &l in graph.leafs() {
        fill(l);
    }
    for &n in graph.nodes() {
        if ctx[n].flags.contains(TensorFlags::INPUT) {
            fill(n);
        }
    }
    for &n in graph.nodes() {
        for &s in &ctx[n].src {
            check(s, &format!("before '{}' read it", ctx[n].name));
        }
        if ctx[n].view_src.is_none() && !ctx[n].flags.contains(TensorFlags::INPUT) {
            fill(n);
        }
    }
    for &n in graph.nodes() {
        if ctx[n].flags.contains(TensorFlags::OUTPUT) {
            check(n, "after compute (output)");
        }
    }
    for &l in graph.leafs() {
        if !own(ctx, l, buffers) {
            check(l, "after compute (external leaf)");
        }
    }
}

/// Ids of the allocator's buffers and, for multi-buffers, of their parts (where tensors live).
fn buffer_ids(alloc: &GraphAllocator) -> Vec<u64> {
    (0..alloc.n_buffer_types())
        .filter_map(|i| alloc.buffer(i))
        .flat_map(|b| std::iter::once(b.id()).chain(b.parts().iter().map(|p| p.id())))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Graphs.

struct Chain {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    weights: Vec<TensorId>,
    out: TensorId,
    _weights_buffer: Arc<Buffer>,
}

/// A 14-node MLP-like chain over `batch` tokens: matmuls with external weights, activations,
/// norms, residual adds, a softmax; tensor sizes vary from 32 to 256 rows.
fn chain(batch: usize) -> Chain {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let x = c.new_tensor(DType::F32, &[64, batch]).unwrap();
    c.set_name(x, "x").unwrap();
    c.set_input(x).unwrap();
    let w1 = c.new_tensor(DType::F32, &[64, 128]).unwrap();
    let w2 = c.new_tensor(DType::F32, &[128, 64]).unwrap();
    let w3 = c.new_tensor(DType::F32, &[64, 256]).unwrap();
    let w4 = c.new_tensor(DType::F32, &[256, 64]).unwrap();
    let w5 = c.new_tensor(DType::F32, &[64, 32]).unwrap();
    let weights = vec![w1, w2, w3, w4, w5];
    let h1 = c.mul_mat(w1, x).unwrap(); // [128, b]
    let h2 = c.silu(h1).unwrap();
    let h3 = c.mul_mat(w2, h2).unwrap(); // [64, b]
    let h4 = c.add(h3, x).unwrap();
    let h5 = c.rms_norm(h4, 1e-5).unwrap(); // h4 has two readers: not in place
    let h6 = c.mul_mat(w3, h5).unwrap(); // [256, b]
    let h7 = c.gelu(h6).unwrap();
    let h8 = c.mul_mat(w4, h7).unwrap(); // [64, b]
    let h9 = c.add(h8, h4).unwrap();
    let h10 = c.scale(h9, 0.5).unwrap();
    let h11 = c.soft_max(h10).unwrap();
    let h12 = c.norm(h11, 1e-5).unwrap();
    let h13 = c.mul(h12, h9).unwrap();
    let out = c.mul_mat(w5, h13).unwrap(); // [32, b]
    for (i, id) in [h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, out]
        .into_iter()
        .enumerate()
    {
        c.set_name(id, format!("h{}", i + 1)).unwrap();
    }
    let weights_buffer = place_weights(&mut ctx, &weights);
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Chain {
        ctx,
        graph,
        x,
        weights,
        out,
        _weights_buffer: weights_buffer,
    }
}

fn data_of(ctx: &Context, id: TensorId) -> (u64, usize) {
    let d = ctx[id].data.as_ref().expect("tensor has storage");
    (d.buffer.id(), d.offset)
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn chain_reuses_memory_without_overlapping_live_tensors() {
    let Chain {
        mut ctx,
        graph,
        x,
        out,
        ..
    } = chain(8);
    assert_eq!(graph.n_nodes(), 14);
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();

    let sum: usize = graph
        .nodes()
        .iter()
        .chain([&x])
        .map(|&n| ctx[n].nbytes().div_ceil(32) * 32)
        .sum();
    let peak = alloc.peak_size(0);
    eprintln!("chain of 14 nodes, batch 8: peak {peak} bytes, sum of input + node sizes {sum}");
    assert!(peak < sum, "peak {peak} must be below the sum {sum}");
    assert_eq!(alloc.buffer_size(0), peak);

    let buffers = buffer_ids(&alloc);
    for &n in graph.nodes() {
        assert!(own(&ctx, n, &buffers), "{} not placed", ctx[n].name);
        let (_, off) = data_of(&ctx, n);
        assert!(off + ctx[n].nbytes() <= peak);
        assert!(off.is_multiple_of(32));
    }
    let pairs = check_no_overlap(&ctx, &graph, &buffers);
    assert!(pairs > 20, "only {pairs} live pairs checked");
    simulate(&ctx, &graph, &buffer_ids(&alloc));
    assert!(ctx[out].flags.contains(TensorFlags::OUTPUT));
}

#[test]
fn inplace_ops_share_src0_only_when_allowed() {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let x = c.new_tensor(DType::F32, &[32, 4]).unwrap();
    c.set_input(x).unwrap();
    let w = c.new_tensor(DType::F32, &[32, 32]).unwrap();
    // Allowed: h1's only reader is silu.
    let h1 = c.mul_mat(w, x).unwrap();
    let s1 = c.silu(h1).unwrap();
    // h2 has two readers: silu must not overwrite it.
    let h2 = c.mul_mat(w, s1).unwrap();
    let s2 = c.silu(h2).unwrap();
    let a2 = c.add(s2, h2).unwrap();
    // h3 is an output: never overwritten.
    let h3 = c.mul_mat(w, a2).unwrap();
    c.set_output(h3).unwrap();
    let s3 = c.scale(h3, 2.0).unwrap();
    // A view of h4 (its only view, at offset 0): rms_norm may take h4's memory through it.
    let h4 = c.mul_mat(w, s3).unwrap();
    let v4 = c.reshape(h4, &[32, 2, 2]).unwrap();
    let n4 = c.rms_norm(v4, 1e-5).unwrap();
    // A view with the same layout as its reader but at a non-zero offset: no in-place.
    let h5 = c.mul_mat(w, x).unwrap();
    let v5 = c.view(h5, &[32, 2], &[128], 256).unwrap();
    let s5 = c.silu(v5).unwrap();
    // Inputs and external weights are never overwritten.
    let sx = c.silu(x).unwrap();
    let sw = c.silu(w).unwrap();
    let out = n4;
    let _w_buf = place_weights(&mut ctx, &[w]);
    let graph = Graph::build(&mut ctx, &[out, s5, sx, sw]).unwrap();
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();

    assert_eq!(data_of(&ctx, s1), data_of(&ctx, h1), "silu in place of h1");
    assert_ne!(
        data_of(&ctx, s2),
        data_of(&ctx, h2),
        "h2 has another reader"
    );
    assert_ne!(data_of(&ctx, s3), data_of(&ctx, h3), "h3 is an output");
    assert_eq!(data_of(&ctx, n4), data_of(&ctx, h4), "through a lone view");
    assert!(ctx[s5].same_layout(&ctx[v5]));
    assert_ne!(data_of(&ctx, s5), data_of(&ctx, v5), "view at an offset");
    assert_ne!(data_of(&ctx, sx), data_of(&ctx, x), "inputs are not reused");
    assert_ne!(
        data_of(&ctx, sw).0,
        data_of(&ctx, w).0,
        "weights are not reused"
    );
    let buffers = buffer_ids(&alloc);
    check_no_overlap(&ctx, &graph, &buffers);
    simulate(&ctx, &graph, &buffer_ids(&alloc));
}

#[test]
fn outputs_are_kept_and_inputs_come_first() {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let w = c.new_tensor(DType::F32, &[64, 64]).unwrap();
    let x = c.new_tensor(DType::F32, &[64, 8]).unwrap();
    c.set_input(x).unwrap();
    // An input read only by the last node.
    let late = c.new_tensor(DType::F32, &[64, 8]).unwrap();
    c.set_name(late, "late").unwrap();
    c.set_input(late).unwrap();
    let first = c.mul_mat(w, x).unwrap();
    // An output produced early (in place of `first`); many nodes follow.
    let early = c.silu(first).unwrap();
    let mut h = early;
    c.set_name(early, "early").unwrap();
    c.set_output(early).unwrap();
    for i in 0..12 {
        h = if i % 2 == 0 {
            c.mul_mat(w, h).unwrap()
        } else {
            c.gelu(h).unwrap()
        };
        c.set_name(h, format!("n{i}")).unwrap();
    }
    let last = c.add(h, late).unwrap();
    let _w_buf = place_weights(&mut ctx, &[w]);
    let graph = Graph::build(&mut ctx, &[early, last]).unwrap();
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();

    // Inputs get the first bytes of the buffer, before any node.
    let mut input_offsets = [data_of(&ctx, x).1, data_of(&ctx, late).1];
    input_offsets.sort();
    assert_eq!(input_offsets, [0, 2048]);
    let (late_off, early_off) = (data_of(&ctx, late).1, data_of(&ctx, early).1);
    for &n in graph.nodes() {
        if n == early || n == first {
            continue;
        }
        let (_, off) = data_of(&ctx, n);
        let end = off + ctx[n].nbytes();
        // No node touches the late input (it is live until the end) nor the early output.
        assert!(
            end <= late_off || off >= late_off + 2048,
            "{} on input",
            ctx[n].name
        );
        assert!(
            end <= early_off || off >= early_off + 2048,
            "{} on output",
            ctx[n].name
        );
    }
    check_no_overlap(&ctx, &graph, &buffer_ids(&alloc));
    simulate(&ctx, &graph, &buffer_ids(&alloc));
}

#[test]
fn several_buffer_types_in_one_graph() {
    let Chain {
        mut ctx, graph, x, ..
    } = chain(8);
    let (a, b) = (buffer_type("A"), buffer_type("B"));
    // Buffer type A is listed twice: ids 0 and 2 share one buffer.
    let mut alloc = GraphAllocator::new(vec![a.clone(), b, a]);
    let n = graph.n_nodes();
    let node_ids: Vec<usize> = (0..n)
        .map(|i| match i {
            _ if i < 5 => 0,
            _ if i < 10 => 1,
            _ => 2,
        })
        .collect();
    let leaf_ids = vec![1; graph.leafs().len()];
    alloc
        .reserve_with(&ctx, &graph, &node_ids, &leaf_ids)
        .unwrap();
    alloc.alloc_graph(&mut ctx, &graph).unwrap();

    let (buf_a, buf_b) = (alloc.buffer(0).unwrap().id(), alloc.buffer(1).unwrap().id());
    assert_ne!(buf_a, buf_b);
    assert_eq!(alloc.buffer(2).unwrap().id(), buf_a);
    assert!(alloc.buffer_size(0) > 0 && alloc.buffer_size(1) > 0);
    assert_eq!(alloc.buffer_size(2), 0, "a shared buffer is counted once");
    eprintln!(
        "split chain: A {} bytes, B {} bytes",
        alloc.buffer_size(0),
        alloc.buffer_size(1)
    );
    for (i, &node) in graph.nodes().iter().enumerate() {
        let want = alloc.buffer(node_ids[i]).unwrap().id();
        assert_eq!(
            data_of(&ctx, node).0,
            want,
            "node {i} in buffer {}",
            node_ids[i]
        );
    }
    // The input is a leaf: it lives in the leaf's buffer.
    assert_eq!(data_of(&ctx, x).0, buf_b);
    check_no_overlap(&ctx, &graph, &[buf_a, buf_b]);
    simulate(&ctx, &graph, &buffer_ids(&alloc));
}

#[test]
fn alloc_after_reserve_reuses_buffers_and_grows_for_bigger_graphs() {
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    let big = chain(16);
    alloc.reserve(&big.ctx, &big.graph).unwrap();
    let (id0, size0) = (alloc.buffer(0).unwrap().id(), alloc.buffer_size(0));

    // Same structure, fewer tokens: the reserved plan fits, nothing is reallocated.
    for batch in [16, 4, 1] {
        let mut small = chain(batch);
        assert!(!alloc.needs_realloc(&small.ctx, &small.graph));
        alloc.alloc_graph(&mut small.ctx, &small.graph).unwrap();
        assert_eq!(alloc.buffer(0).unwrap().id(), id0, "batch {batch}");
        check_no_overlap(&small.ctx, &small.graph, &[id0]);
        simulate(&small.ctx, &small.graph, &buffer_ids(&alloc));
    }

    // More tokens: re-planned automatically, the buffer grows.
    let mut bigger = chain(64);
    assert!(alloc.needs_realloc(&bigger.ctx, &bigger.graph));
    alloc.alloc_graph(&mut bigger.ctx, &bigger.graph).unwrap();
    let id1 = alloc.buffer(0).unwrap().id();
    assert_ne!(id1, id0);
    assert!(alloc.buffer_size(0) > size0);
    eprintln!(
        "reserve: batch 16 -> {size0} bytes, batch 64 -> {}",
        alloc.buffer_size(0)
    );
    check_no_overlap(&bigger.ctx, &bigger.graph, &[id1]);
    simulate(&bigger.ctx, &bigger.graph, &buffer_ids(&alloc));

    // Back to a smaller graph: the grown buffer is kept.
    let mut again = chain(8);
    alloc.alloc_graph(&mut again.ctx, &again.graph).unwrap();
    assert_eq!(alloc.buffer(0).unwrap().id(), id1);

    // A different structure in the same single-buffer allocator is re-planned, not refused.
    let mut other = chain(8);
    let extra = other.ctx.silu(other.out).unwrap();
    let graph = Graph::build(&mut other.ctx, &[extra]).unwrap();
    alloc.alloc_graph(&mut other.ctx, &graph).unwrap();
    assert_eq!(alloc.buffer(0).unwrap().id(), id1, "still fits");
    simulate(&other.ctx, &graph, &buffer_ids(&alloc));
}

#[test]
fn tensors_with_storage_are_left_alone() {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let w = c.new_tensor(DType::F32, &[32, 32]).unwrap();
    let x = c.new_tensor(DType::F32, &[32, 4]).unwrap();
    c.set_input(x).unwrap();
    // A node whose result goes to caller-owned memory (like a KV cache write).
    let h = c.mul_mat(w, x).unwrap();
    c.set_name(h, "kv").unwrap();
    let s = c.silu(h).unwrap();
    let out = c.mul_mat(w, s).unwrap();
    let user = place_weights(&mut ctx, &[w, h]);
    let (w_before, h_before) = (data_of(&ctx, w), data_of(&ctx, h));
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();

    assert_eq!(data_of(&ctx, w), w_before);
    assert_eq!(data_of(&ctx, h), h_before);
    assert_eq!(h_before.0, user.id());
    // silu may not run in place of caller-owned memory.
    assert_eq!(data_of(&ctx, s).0, alloc.buffer(0).unwrap().id());
    // Only x, s and out live in the compute buffer: 512 + 512 + 512 bytes at most.
    assert!(alloc.buffer_size(0) <= 3 * 512);
    simulate(&ctx, &graph, &buffer_ids(&alloc));

    // Allocating again changes nothing: everything already has storage.
    let before: Vec<_> = graph.nodes().iter().map(|&n| data_of(&ctx, n)).collect();
    alloc.alloc_graph(&mut ctx, &graph).unwrap();
    let after: Vec<_> = graph.nodes().iter().map(|&n| data_of(&ctx, n)).collect();
    assert_eq!(before, after);
}

#[test]
fn bad_ids_foreign_tensors_and_failed_allocations_are_errors() {
    let ch = chain(8);
    let n = ch.graph.n_nodes();
    let l = ch.graph.leafs().len();
    let mut alloc = GraphAllocator::new(vec![buffer_type("A"), buffer_type("B")]);

    let bad = vec![2; n];
    let err = alloc
        .reserve_with(&ch.ctx, &ch.graph, &bad, &[])
        .unwrap_err();
    assert!(matches!(err, Error::GraphAlloc(_)), "{err}");
    assert!(err.to_string().contains("buffer id 2"), "{err}");
    let err = alloc
        .reserve_with(&ch.ctx, &ch.graph, &[0; 3], &[])
        .unwrap_err();
    assert!(matches!(err, Error::GraphAlloc(_)), "{err}");
    let err = alloc
        .reserve_with(&ch.ctx, &ch.graph, &[], &vec![7; l])
        .unwrap_err();
    assert!(matches!(err, Error::GraphAlloc(_)), "{err}");

    // A graph of another (smaller) context.
    let mut small = Context::new();
    small.new_tensor(DType::F32, &[4]).unwrap();
    let err = alloc.reserve(&small, &ch.graph).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor(_)), "{err}");
    let err = alloc.alloc_graph(&mut small, &ch.graph).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor(_)), "{err}");

    // Several buffer types and an unreserved graph: the allocator cannot guess the ids.
    let mut other = chain(8);
    let err = alloc.alloc_graph(&mut other.ctx, &other.graph).unwrap_err();
    assert!(matches!(err, Error::GraphAlloc(_)), "{err}");
    assert!(err.to_string().contains("reserve_with"), "{err}");
    // After reserving it, the same structure with other sizes is re-planned with its ids.
    let ids: Vec<usize> = (0..n).map(|i| i % 2).collect();
    alloc
        .reserve_with(&other.ctx, &other.graph, &ids, &[])
        .unwrap();
    let mut grown = chain(32);
    alloc.alloc_graph(&mut grown.ctx, &grown.graph).unwrap();
    for (i, &node) in grown.graph.nodes().iter().enumerate() {
        assert_eq!(
            data_of(&grown.ctx, node).0,
            alloc.buffer(ids[i]).unwrap().id()
        );
    }

    // A buffer type that cannot hold the peak.
    let tiny: BufferTypeRef = common::vec_buffer_type("tiny", 1024);
    let mut alloc = GraphAllocator::new(vec![tiny]);
    let mut ch = chain(8);
    let err = alloc.alloc_graph(&mut ch.ctx, &ch.graph).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(alloc.needs_realloc(&ch.ctx, &ch.graph));
    assert!(ch.graph.nodes().iter().all(|&n| ch.ctx[n].data.is_none()));
    let _ = ch.weights;
}

#[test]
fn views_missing_from_the_node_list_keep_their_source_alive() {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let w = c.new_tensor(DType::F32, &[32, 32]).unwrap();
    let x = c.new_tensor(DType::F32, &[32, 4]).unwrap();
    c.set_input(x).unwrap();
    let r = c.mul_mat(w, x).unwrap();
    let v = c.view(r, &[32, 2], &[128], 256).unwrap();
    let a = c.mul_mat(w, r).unwrap();
    let b = c.mul_mat(w, a).unwrap();
    let d = c.mul_mat(w, b).unwrap();
    let y = c.silu(v).unwrap();
    c.set_output(d).unwrap();
    c.set_output(y).unwrap();
    let _w_buf = place_weights(&mut ctx, &[w]);
    // A node list without the view (as a graph made of a node range would be).
    let graph = Graph::from_nodes(vec![r, a, b, d, y]);
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();

    let (rb, ro) = data_of(&ctx, r);
    assert_eq!(data_of(&ctx, v), (rb, ro + 256));
    // `r` is read through `v` by the last node: nothing computed before may take its bytes.
    for n in [a, b, d] {
        let (_, off) = data_of(&ctx, n);
        assert!(off + 512 <= ro || off >= ro + 512, "{n:?} overlaps r");
    }
}

/// Every node lies inside one part of the (multi-)buffer of buffer type 0, aligned, and every
/// part is at most `max` bytes. Returns the ids of the parts the nodes use.
fn check_chunks(ctx: &Context, graph: &Graph, alloc: &GraphAllocator, max: usize) -> HashSet<u64> {
    let buffer = alloc.buffer(0).unwrap();
    let parts: Vec<Arc<Buffer>> = if buffer.is_multi() {
        buffer.parts().to_vec()
    } else {
        vec![buffer.clone()]
    };
    assert!(
        parts.iter().all(|p| p.size() <= max),
        "a chunk exceeds {max}"
    );
    assert_eq!(
        alloc.buffer_size(0),
        parts.iter().map(|p| p.size()).sum::<usize>()
    );
    let mut used = HashSet::new();
    for &n in graph.nodes() {
        let d = ctx[n].data.as_ref().unwrap();
        let part = parts
            .iter()
            .find(|p| p.id() == d.buffer.id())
            .unwrap_or_else(|| panic!("'{}' is not in a part", ctx[n].name));
        assert!(d.offset + ctx[n].nbytes() <= part.size());
        assert!(d.offset.is_multiple_of(32));
        used.insert(part.id());
    }
    used
}

#[test]
fn peaks_above_max_size_are_allocated_in_chunks() {
    const MAX: usize = 4096;
    let small: BufferTypeRef = common::vec_buffer_type("small", MAX);
    // Batch 4: the largest tensors are [256, 4] f32, exactly MAX bytes.
    let Chain {
        mut ctx,
        graph,
        out,
        ..
    } = chain(4);
    let unbounded = GraphAllocator::new(vec![buffer_type("U")])
        .measure_with(&ctx, &graph, &[], &[])
        .unwrap()[0];
    assert!(unbounded > MAX, "the test needs a peak above {MAX}");

    let mut alloc = GraphAllocator::new(vec![small.clone()]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();
    let buffer = alloc.buffer(0).unwrap().clone();
    assert!(buffer.is_multi());
    assert!(buffer.parts().len() >= 2);
    assert_eq!(buffer.usage(), BufferUsage::Compute);
    assert!(buffer
        .parts()
        .iter()
        .all(|p| p.usage() == BufferUsage::Compute));
    assert_eq!(alloc.peak_size(0), alloc.buffer_size(0));
    eprintln!(
        "chain batch 4: unbounded peak {unbounded}, chunks {:?}",
        buffer.parts().iter().map(|p| p.size()).collect::<Vec<_>>()
    );
    let used = check_chunks(&ctx, &graph, &alloc, MAX);
    assert!(used.len() >= 2, "the nodes use only {} chunk", used.len());
    let ids = buffer_ids(&alloc);
    let pairs = check_no_overlap(&ctx, &graph, &ids);
    assert!(pairs > 20, "only {pairs} live pairs checked");
    simulate(&ctx, &graph, &ids);
    assert!(own(&ctx, out, &ids));

    // The same structure again reuses the plan and the buffers.
    let mut again = chain(4);
    assert!(!alloc.needs_realloc(&again.ctx, &again.graph));
    alloc.alloc_graph(&mut again.ctx, &again.graph).unwrap();
    assert_eq!(alloc.buffer(0).unwrap().id(), buffer.id());
    simulate(&again.ctx, &again.graph, &buffer_ids(&alloc));

    // Reserved for a smaller batch first: one plain buffer, which then grows into chunks.
    let mut alloc = GraphAllocator::new(vec![small.clone()]);
    let one = chain(1);
    alloc.reserve(&one.ctx, &one.graph).unwrap();
    assert!(!alloc.buffer(0).unwrap().is_multi());
    let mut grown = chain(4);
    alloc.alloc_graph(&mut grown.ctx, &grown.graph).unwrap();
    assert!(alloc.buffer(0).unwrap().is_multi());
    check_chunks(&grown.ctx, &grown.graph, &alloc, MAX);
    let ids = buffer_ids(&alloc);
    check_no_overlap(&grown.ctx, &grown.graph, &ids);
    simulate(&grown.ctx, &grown.graph, &ids);

    // With one unbounded and one limited buffer type, only the limited one is chunked.
    let mut alloc = GraphAllocator::new(vec![buffer_type("U"), small]);
    let mut two = chain(4);
    let n = two.graph.n_nodes();
    let node_ids: Vec<usize> = (0..n).map(|i| usize::from(i >= n / 2)).collect();
    alloc
        .reserve_with(&two.ctx, &two.graph, &node_ids, &[])
        .unwrap();
    alloc.alloc_graph(&mut two.ctx, &two.graph).unwrap();
    assert!(!alloc.buffer(0).unwrap().is_multi());
    assert!(alloc
        .buffer(1)
        .unwrap()
        .parts()
        .iter()
        .all(|p| p.size() <= MAX));
    let ids = buffer_ids(&alloc);
    check_no_overlap(&two.ctx, &two.graph, &ids);
    simulate(&two.ctx, &two.graph, &ids);
}

/// An output that is a view (a reshape, as `kqv_out` can be) keeps its source's bytes: once the
/// view's readers are done, the source must not be freed and reused, or reading the output
/// back gives a later node's values.
#[test]
fn outputs_that_are_views_keep_their_source() {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let w = c.new_tensor(DType::F32, &[64, 64]).unwrap();
    let x = c.new_tensor(DType::F32, &[64, 8]).unwrap();
    c.set_input(x).unwrap();
    let a = c.mul_mat(w, x).unwrap();
    c.set_name(a, "a").unwrap();
    let view = c.reshape(a, &[64 * 8]).unwrap();
    c.set_name(view, "view").unwrap();
    c.set_output(view).unwrap();
    // A reader of the view, then nodes of the same size that could take a's bytes.
    let read = c.scale(view, 2.0).unwrap();
    let mut h = c.reshape(read, &[64, 8]).unwrap();
    for i in 0..6 {
        h = c.mul_mat(w, h).unwrap();
        c.set_name(h, format!("n{i}")).unwrap();
    }
    let _w_buf = place_weights(&mut ctx, &[w]);
    let graph = Graph::build(&mut ctx, &[view, h]).unwrap();
    let mut alloc = GraphAllocator::new(vec![buffer_type("A")]);
    alloc.alloc_graph(&mut ctx, &graph).unwrap();
    let (buf, a_off) = data_of(&ctx, a);
    let end = a_off + ctx[a].nbytes();
    for &n in graph.nodes() {
        if n == a || ctx[n].view_src.is_some() || !own(&ctx, n, &[buf]) {
            continue;
        }
        let (_, off) = data_of(&ctx, n);
        assert!(
            off + ctx[n].nbytes() <= a_off || off >= end,
            "{} took the bytes of the output view's source",
            ctx[n].name
        );
    }
    check_no_overlap(&ctx, &graph, &buffer_ids(&alloc));
}
