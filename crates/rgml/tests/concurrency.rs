//! Concurrency plans and the graph allocator: the greedy dependency levels, and that with a
//! plan no node of a group is placed in memory another node of the group writes or reads
//! (while without one the allocator plans exactly as before, reusing such memory).

mod common;

use rand::{Rng, SeedableRng};
use rgml::alloc::{Concurrency, GraphAllocator};
use rgml::{BufferTypeRef, Context, DType, Graph, TensorId};

fn buffer_type() -> BufferTypeRef {
    common::vec_buffer_type("A", usize::MAX)
}

/// The byte range (buffer id, start, end) a tensor occupies, views included.
fn range(ctx: &Context, id: TensorId) -> Option<(u64, usize, usize)> {
    let t = &ctx[id];
    let d = t.data.as_ref()?;
    Some((d.buffer.id(), d.offset, d.offset + t.nbytes().max(1)))
}

fn overlap(a: (u64, usize, usize), b: (u64, usize, usize)) -> bool {
    a.0 == b.0 && a.1 < b.2 && b.1 < a.2
}

/// Pairs (X, Y) of different nodes of one group where X writes memory Y writes or reads;
/// returns the conflicts and how many pairs were checked.
fn conflicts(ctx: &Context, graph: &Graph, plan: &Concurrency) -> (Vec<String>, usize) {
    let nodes = graph.nodes();
    let mut bad = Vec::new();
    let mut checked = 0;
    for g in plan.groups() {
        for x in g.clone() {
            let nx = nodes[x];
            if ctx[nx].op.kind().is_view() {
                continue;
            }
            let Some(wx) = range(ctx, nx) else { continue };
            // View nodes compute nothing: they touch no memory when the graph runs.
            for y in g
                .clone()
                .filter(|&y| y != x && !ctx[nodes[y]].op.kind().is_view())
            {
                let ny = nodes[y];
                let mut touched = vec![ny];
                touched.extend(ctx[ny].src.iter().copied());
                for t in touched {
                    if let Some(r) = range(ctx, t) {
                        checked += 1;
                        if overlap(wx, r) {
                            bad.push(format!(
                                "node {x} ({nx:?}, {:?}) writes {wx:?}, over {t:?} used by node {y} ({ny:?}, {:?})",
                                ctx[nx].op.kind(),
                                ctx[ny].op.kind()
                            ));
                        }
                    }
                }
            }
        }
    }
    (bad, checked)
}

/// x → n0 = 2x, n1 = gelu(x) | n2 = n0 + n1 (in place over n0), n3 = 3x | n4 = n2 + n3.
/// Without a plan n3 takes the memory n1 had, which n2 (same group) still reads.
fn diamond() -> (Context, Graph) {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let x = c.new_tensor(DType::F32, &[256]).unwrap();
    c.set_input(x).unwrap();
    let n0 = c.scale(x, 2.0).unwrap();
    let n1 = c.gelu(x).unwrap();
    let n2 = c.add(n0, n1).unwrap();
    let n3 = c.scale(x, 3.0).unwrap();
    let n4 = c.add(n2, n3).unwrap();
    for (i, id) in [n0, n1, n2, n3, n4].into_iter().enumerate() {
        c.set_name(id, format!("n{i}")).unwrap();
    }
    let graph = Graph::build(&mut ctx, &[n4]).unwrap();
    assert_eq!(graph.nodes(), &[n0, n1, n2, n3, n4]);
    (ctx, graph)
}

#[test]
fn dependency_levels_are_greedy_and_contiguous() {
    let (ctx, graph) = diamond();
    let plan = Concurrency::from_dependencies(&ctx, &graph).unwrap();
    assert_eq!(plan.groups().collect::<Vec<_>>(), vec![0..2, 2..4, 4..5]);
    assert_eq!(plan.n_nodes(), 5);
    // A plan of the wrong size is refused.
    let mut alloc = GraphAllocator::new(vec![buffer_type()]);
    let wrong = Concurrency::sequential(4);
    assert!(alloc
        .reserve_with_concurrency(&ctx, &graph, &[], &[], Some(&wrong))
        .is_err());
}

#[test]
fn with_a_plan_group_mates_never_share_memory() {
    let (mut plain, graph) = diamond();
    let plan = Concurrency::from_dependencies(&plain, &graph).unwrap();
    let mut ctx = plain.clone();
    let mut s = plain.clone();

    let mut a = GraphAllocator::new(vec![buffer_type()]);
    a.alloc_graph(&mut plain, &graph).unwrap();
    let (bad, _) = conflicts(&plain, &graph, &plan);
    assert!(
        !bad.is_empty(),
        "without a plan the allocator should reuse n1's memory for n3"
    );
    assert!(a.concurrency().is_none());

    let mut b = GraphAllocator::new(vec![buffer_type()]);
    b.reserve_with_concurrency(&ctx, &graph, &[], &[], Some(&plan))
        .unwrap();
    assert_eq!(b.concurrency(), Some(&plan));
    b.alloc_graph(&mut ctx, &graph).unwrap();
    let (bad, checked) = conflicts(&ctx, &graph, &plan);
    assert!(bad.is_empty(), "{bad:?}");
    assert!(checked >= 4);
    assert!(b.peak_size(0) >= a.peak_size(0));
    // Re-allocating the same graph keeps the plan.
    assert!(!b.needs_realloc(&ctx, &graph));
    b.alloc_graph(&mut ctx, &graph).unwrap();
    assert_eq!(b.concurrency(), Some(&plan));

    // The sequential plan is the plan without concurrency.
    let mut c = GraphAllocator::new(vec![buffer_type()]);
    let seq = Concurrency::sequential(graph.n_nodes());
    c.reserve_with_concurrency(&s, &graph, &[], &[], Some(&seq))
        .unwrap();
    c.alloc_graph(&mut s, &graph).unwrap();
    assert_eq!(c.peak_size(0), a.peak_size(0));
    for &n in graph.nodes() {
        assert_eq!(
            s[n].data.as_ref().map(|d| d.offset),
            plain[n].data.as_ref().map(|d| d.offset)
        );
    }
}

/// Random graphs of element-wise ops (in-place capable or not), views included: with the
/// dependency plan no group has a conflict.
#[test]
fn random_graphs_have_no_conflicts_within_groups() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut total_checked = 0;
    let mut plain_conflicts = 0;
    for _ in 0..40 {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[64]).unwrap();
        ctx.set_input(x).unwrap();
        let mut pool = vec![x];
        for _ in 0..rng.gen_range(6..20) {
            let a = pool[rng.gen_range(0..pool.len())];
            let b = pool[rng.gen_range(0..pool.len())];
            let t = match rng.gen_range(0..6) {
                0 => ctx.add(a, b).unwrap(),
                1 => ctx.mul(a, b).unwrap(),
                2 => ctx.scale(a, 0.5).unwrap(),
                3 => ctx.silu(a).unwrap(),
                4 => ctx.gelu(a).unwrap(),
                _ => ctx
                    .reshape(a, &[8, 8])
                    .map_or(a, |r| ctx.reshape(r, &[64]).unwrap()),
            };
            pool.push(t);
        }
        // Every tensor nobody reads is an output, so the graph has branches.
        let last = *pool.last().unwrap();
        let outs: Vec<TensorId> = pool
            .iter()
            .copied()
            .filter(|&t| t != x && (t == last || rng.gen_bool(0.2)))
            .collect();
        let graph = Graph::build(&mut ctx, &outs).unwrap();
        let plan = Concurrency::from_dependencies(&ctx, &graph).unwrap();

        let mut without = ctx.clone();
        let mut a = GraphAllocator::new(vec![buffer_type()]);
        a.alloc_graph(&mut without, &graph).unwrap();
        plain_conflicts += conflicts(&without, &graph, &plan).0.len();

        let mut b = GraphAllocator::new(vec![buffer_type()]);
        b.reserve_with_concurrency(&ctx, &graph, &[], &[], Some(&plan))
            .unwrap();
        b.alloc_graph(&mut ctx, &graph).unwrap();
        let (bad, checked) = conflicts(&ctx, &graph, &plan);
        assert!(bad.is_empty(), "{bad:?}");
        total_checked += checked;
    }
    eprintln!(
        "{total_checked} pairs checked; without the plan {plain_conflicts} conflicts would occur"
    );
    assert!(total_checked > 100);
    assert!(plain_conflicts > 0, "the test graphs should need the plan");
}
