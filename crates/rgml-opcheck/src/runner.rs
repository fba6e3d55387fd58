//! Running cases on a backend: fill inputs, allocate (with sentinel bytes around the output),
//! compute, and compare with the reference; plus the support table and timings.
//!
//! This module owns the comparison rules (NMSE, NaN/Inf, exact i32) and the memory checks. It
//! talks to backends only through the public backend API.

use crate::cases::{all_cases, Builder, Case, Init};
use crate::reference::{self, Mem};
use crate::{codec, CaseReport, Outcome, Summary};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::alloc::{align_up, alloc_ctx_tensors};
use rgml::{Backend, Buffer, Context, DType, Graph, OpKind, Result, TensorId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Byte written around and into the output before compute: as f32 it reads 3.4e38, as f16 NaN,
/// so an element a kernel forgets to write cannot pass.
const SENTINEL: u8 = 0x7f;
/// Guard bytes before and after the output (rounded up to the buffer alignment).
const GUARD: usize = 128;

/// A case's graph, built but not yet allocated.
struct Prepared {
    ctx: Context,
    graph: Graph,
    out: TensorId,
    leaves: Vec<(TensorId, Init)>,
}

fn prepare(case: &Case) -> Result<Prepared> {
    let mut ctx = Context::new();
    let mut b = Builder {
        ctx: &mut ctx,
        leaves: Vec::new(),
    };
    let out = case.build(&mut b)?;
    let leaves = b.leaves;
    ctx.set_name(out, "out")?;
    let graph = Graph::build(&mut ctx, &[out])?;
    Ok(Prepared {
        ctx,
        graph,
        out,
        leaves,
    })
}

/// Whether `backend` can compute every node of the graph that runs a kernel.
fn supported(backend: &dyn Backend, p: &Prepared) -> bool {
    p.graph
        .nodes()
        .iter()
        .all(|&id| p.ctx[id].op.kind().is_view() || backend.supports_op(&p.ctx, id))
}

/// A stable 64-bit seed from a case name (FNV-1a), so every case has its own fixed data.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn gen_values(rng: &mut StdRng, ne: [usize; 4], init: Init) -> Vec<f32> {
    let n: usize = ne.iter().product();
    match init {
        Init::Uniform(lo, hi) => (0..n).map(|_| rng.gen_range(lo..hi)).collect(),
        Init::Index(m) => (0..n).map(|_| rng.gen_range(0..m.max(1)) as f32).collect(),
        Init::Distinct(m) => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n / ne[0].max(1) {
                let mut pool: Vec<usize> = (0..m).collect();
                for i in 0..ne[0] {
                    // Partial Fisher-Yates: the first ne0 entries are a random distinct draw
                    // (repeats only if asked for more indices than rows exist).
                    if i < m {
                        let j = rng.gen_range(i..m);
                        pool.swap(i, j);
                        v.push(pool[i] as f32);
                    } else {
                        v.push(0.0);
                    }
                }
            }
            v
        }
        Init::Causal(n_past) => {
            let mut v = Vec::with_capacity(n);
            for r in 0..n / ne[0].max(1) {
                let j = r % ne[1];
                for i in 0..ne[0] {
                    v.push(if i > n_past + j {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    });
                }
            }
            v
        }
    }
}

/// Compare `actual` with `expected`: non-finite values must match exactly (NaN with NaN, an
/// infinity with the same infinity); finite ones must have NMSE `Σ(a-b)²/Σb²` at most
/// `threshold`. Returns the outcome and the NMSE when it could be computed.
pub fn compare(actual: &[f64], expected: &[f64], threshold: f64) -> (Outcome, Option<f64>) {
    if actual.len() != expected.len() {
        return (
            Outcome::Failed(format!(
                "{} values, expected {}",
                actual.len(),
                expected.len()
            )),
            None,
        );
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&a, &b)) in actual.iter().zip(expected).enumerate() {
        if !a.is_finite() || !b.is_finite() {
            let same = (a.is_nan() && b.is_nan()) || a == b;
            if !same {
                return (
                    Outcome::Failed(format!("element {i}: got {a}, expected {b}")),
                    None,
                );
            }
            continue;
        }
        num += (a - b) * (a - b);
        den += b * b;
    }
    let nmse = if den > 0.0 { num / den } else { num };
    if nmse <= threshold {
        (Outcome::Passed, Some(nmse))
    } else {
        (
            Outcome::Failed(format!("NMSE {nmse:.3e} > {threshold:.1e}")),
            Some(nmse),
        )
    }
}

/// Compare integer results: every element must be equal.
fn compare_exact(actual: &[f64], expected: &[f64]) -> (Outcome, Option<f64>) {
    if actual.len() != expected.len() {
        return (Outcome::Failed("wrong element count".into()), None);
    }
    match actual.iter().zip(expected).position(|(a, b)| a != b) {
        None => (Outcome::Passed, Some(0.0)),
        Some(i) => (
            Outcome::Failed(format!(
                "element {i}: got {}, expected {}",
                actual[i], expected[i]
            )),
            None,
        ),
    }
}

/// An allocated, filled case ready to compute.
struct Ready {
    p: Prepared,
    /// The output's root, alone in `guarded` at byte `guard`.
    root: TensorId,
    guarded: Arc<Buffer>,
    guard: usize,
    root_size: usize,
    /// Input bytes as written, to check that compute leaves them alone.
    inputs: Vec<(TensorId, Vec<u8>)>,
    /// The reference's memory, loaded with the inputs.
    mem: Mem,
}

fn setup(backend: &dyn Backend, case: &Case, p: Prepared) -> Result<Ready> {
    let mut p = p;
    let bt = backend.default_buffer_type();
    let root = p.ctx[p.out].view_src.unwrap_or(p.out);
    // The output's root gets its own buffer with guard bytes on both sides.
    let guard = align_up(GUARD, bt.alignment());
    let root_size = bt.alloc_size(&p.ctx[root]);
    let guarded = Buffer::alloc(&bt, guard + align_up(root_size, bt.alignment()) + guard)?;
    guarded.clear(SENTINEL)?;
    p.ctx.set_data(root, guarded.clone(), guard)?;
    if let Some(buf) = alloc_ctx_tensors(&mut p.ctx, &bt)? {
        // Intermediates start as garbage too: a kernel must write everything it outputs.
        buf.clear(SENTINEL)?;
    }
    let views: Vec<TensorId> = p
        .ctx
        .ids()
        .filter(|&id| p.ctx[id].data.is_none() && p.ctx[id].view_src.is_some())
        .collect();
    for id in views {
        p.ctx.init_view(id)?;
    }
    let mut rng = StdRng::seed_from_u64(seed_of(&case.name));
    let mut mem = Mem::new();
    let mut inputs = Vec::new();
    for &(id, init) in &p.leaves {
        let t = &p.ctx[id];
        let values = gen_values(&mut rng, t.ne, init);
        let bytes = codec::encode(t.dtype, &values)?;
        p.ctx.tensor_set(id, 0, &bytes)?;
        mem.load(&p.ctx, id, &bytes)?;
        inputs.push((id, bytes));
    }
    Ok(Ready {
        p,
        root,
        guarded,
        guard,
        root_size,
        inputs,
        mem,
    })
}

/// Check guards and inputs after compute, then compare the output with the reference.
fn check(case: &Case, mut r: Ready) -> Result<(Outcome, Option<f64>)> {
    let total = r.guarded.size();
    let mut bytes = vec![0u8; total];
    r.guarded.get(0, &mut bytes)?;
    let end = r.guard + r.root_size;
    if let Some(i) = bytes[..r.guard].iter().rposition(|&b| b != SENTINEL) {
        return Ok((
            Outcome::Failed(format!("wrote {} byte(s) before the output", r.guard - i)),
            None,
        ));
    }
    if let Some(i) = bytes[end..].iter().position(|&b| b != SENTINEL) {
        return Ok((
            Outcome::Failed(format!("wrote past the end of the output (byte +{i})")),
            None,
        ));
    }
    for (id, before) in &r.inputs {
        if *id == r.root {
            continue;
        }
        if r.p.ctx.tensor_bytes(*id)? != *before {
            return Ok((
                Outcome::Failed(format!(
                    "input '{}' was modified",
                    r.p.ctx[*id].display_name()
                )),
                None,
            ));
        }
    }
    let out_bytes = &bytes[r.guard..r.guard + r.p.ctx[r.root].nbytes()];
    let mut actual_mem = Mem::new();
    actual_mem.load(&r.p.ctx, r.root, out_bytes)?;
    let actual = actual_mem.read(&r.p.ctx, r.p.out)?;
    reference::eval(&r.p.ctx, &r.p.graph, &mut r.mem)?;
    let expected = r.mem.read(&r.p.ctx, r.p.out)?;
    Ok(if r.p.ctx[r.p.out].dtype == DType::I32 {
        compare_exact(&actual, &expected)
    } else {
        compare(&actual, &expected, case.threshold)
    })
}

/// Run one case on `backend`.
pub fn run_case(backend: &mut dyn Backend, case: &Case) -> CaseReport {
    let report = |outcome, nmse| CaseReport {
        name: case.name.clone(),
        op: case.op,
        outcome,
        nmse,
    };
    let p = match prepare(case) {
        Ok(p) => p,
        Err(e) => return report(Outcome::Failed(format!("building the graph: {e}")), None),
    };
    if !supported(backend, &p) {
        return report(Outcome::Unsupported, None);
    }
    let ready = match setup(backend, case, p) {
        Ok(r) => r,
        Err(e) => return report(Outcome::Failed(format!("setup: {e}")), None),
    };
    if let Err(e) = backend
        .graph_compute(&ready.p.ctx, &ready.p.graph)
        .and_then(|_| backend.synchronize())
    {
        return report(Outcome::Failed(format!("compute: {e}")), None);
    }
    match check(case, ready) {
        Ok((o, nmse)) => report(o, nmse),
        Err(e) => report(Outcome::Failed(format!("checking: {e}")), None),
    }
}

fn selected(op: Option<OpKind>) -> impl Iterator<Item = Case> {
    all_cases()
        .into_iter()
        .filter(move |c| op.is_none_or(|o| c.op == o))
}

/// Run every case (optionally only of one op) on `backend`, calling `on_case` per case.
pub fn run_tests(
    backend: &mut dyn Backend,
    op: Option<OpKind>,
    on_case: &mut dyn FnMut(&CaseReport),
) -> Result<Summary> {
    let mut s = Summary::default();
    for case in selected(op) {
        let r = run_case(backend, &case);
        match r.outcome {
            Outcome::Passed => s.passed += 1,
            Outcome::Failed(_) => s.failed += 1,
            Outcome::Unsupported => s.unsupported += 1,
        }
        on_case(&r);
    }
    Ok(s)
}

/// The support table: one row per case family, one column per backend; a cell says `yes` when
/// the backend supports every case of the family, `no` for none, `k/n` in between.
pub fn support_table(backends: &mut [Box<dyn Backend>], op: Option<OpKind>) -> Result<String> {
    let mut families: Vec<String> = Vec::new();
    // family -> per backend (supported, total)
    let mut counts: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
    for case in selected(op) {
        let p = prepare(&case)?;
        let row = counts.entry(case.family.clone()).or_insert_with(|| {
            families.push(case.family.clone());
            vec![(0, 0); backends.len()]
        });
        for (cell, b) in row.iter_mut().zip(backends.iter()) {
            cell.1 += 1;
            if supported(b.as_ref(), &p) {
                cell.0 += 1;
            }
        }
    }
    let names: Vec<String> = backends.iter().map(|b| b.name().to_string()).collect();
    let w0 = families.iter().map(String::len).max().unwrap_or(0).max(6);
    let mut out = format!("{:w0$}", "family");
    for n in &names {
        out += &format!("  {n:>8}");
    }
    out.push('\n');
    for f in &families {
        out += &format!("{f:w0$}");
        for &(yes, total) in counts.get(f).map(Vec::as_slice).unwrap_or(&[]) {
            let cell = if yes == total {
                "yes".to_string()
            } else if yes == 0 {
                "no".to_string()
            } else {
                format!("{yes}/{total}")
            };
            out += &format!("  {cell:>8}");
        }
        out.push('\n');
    }
    Ok(out)
}

/// Timing of one case.
#[derive(Clone, Debug)]
pub struct PerfReport {
    /// Case name.
    pub name: String,
    /// Op under test.
    pub op: OpKind,
    /// Mean microseconds per graph compute; `None` when the backend does not support the case.
    pub us_per_run: Option<f64>,
    /// Floating-point operations per run (MUL_MAT: 2·m·n·k·batch), 0 for memory-bound ops.
    pub flops: f64,
    /// Bytes read and written per run (inputs and output).
    pub bytes: usize,
}

impl PerfReport {
    /// A one-line summary: time, GFLOPS (MUL_MAT) and GB/s of the bytes read and written.
    pub fn line(&self) -> String {
        match self.us_per_run {
            None => format!("{}: unsupported", self.name),
            Some(us) if self.flops > 0.0 => format!(
                "{}: {us:.1} us/run, {:.2} GFLOPS, {:.2} GB/s",
                self.name,
                self.flops / us / 1e3,
                self.bytes as f64 / us / 1e3
            ),
            Some(us) => format!(
                "{}: {us:.1} us/run, {:.2} GB/s",
                self.name,
                self.bytes as f64 / us / 1e3
            ),
        }
    }
}

/// Time every case (optionally only of one op) on `backend`: one warm-up, then runs for about
/// `budget_ms` each.
pub fn run_perf(
    backend: &mut dyn Backend,
    op: Option<OpKind>,
    budget_ms: u64,
    on_case: &mut dyn FnMut(&PerfReport),
) -> Result<()> {
    run_perf_cases(backend, selected(op), budget_ms, on_case)
}

/// Time `cases` on `backend`, as [`run_perf`] does.
pub fn run_perf_cases(
    backend: &mut dyn Backend,
    cases: impl IntoIterator<Item = Case>,
    budget_ms: u64,
    on_case: &mut dyn FnMut(&PerfReport),
) -> Result<()> {
    for case in cases {
        let p = prepare(&case)?;
        let mut rep = PerfReport {
            name: case.name.clone(),
            op: case.op,
            us_per_run: None,
            flops: 0.0,
            bytes: 0,
        };
        for &id in p.graph.nodes() {
            let t = &p.ctx[id];
            if t.op.kind() == OpKind::MulMat {
                rep.flops += 2.0 * p.ctx[t.src[0]].ne[0] as f64 * t.nelements() as f64;
            }
        }
        rep.bytes = p
            .leaves
            .iter()
            .map(|(id, _)| p.ctx[*id].nbytes())
            .sum::<usize>()
            + p.ctx[p.out].nbytes();
        if supported(backend, &p) {
            let r = setup(backend, &case, p)?;
            backend.graph_compute(&r.p.ctx, &r.p.graph)?;
            backend.synchronize()?;
            let start = Instant::now();
            let mut runs = 0u32;
            while runs < 3 || (start.elapsed().as_millis() < budget_ms as u128 && runs < 10000) {
                backend.graph_compute(&r.p.ctx, &r.p.graph)?;
                runs += 1;
            }
            backend.synchronize()?;
            rep.us_per_run = Some(start.elapsed().as_secs_f64() * 1e6 / runs as f64);
        }
        on_case(&rep);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparator_catches_errors() {
        let exp: Vec<f64> = (0..100).map(|i| (i as f64 * 0.37).sin()).collect();
        assert_eq!(compare(&exp, &exp, 1e-7).0, Outcome::Passed);
        // A 1% perturbation of one element in a hundred is far above 1e-7.
        let mut bad = exp.clone();
        bad[10] += 0.01;
        let (o, nmse) = compare(&bad, &exp, 1e-7);
        assert!(matches!(o, Outcome::Failed(_)), "{o:?}");
        assert!(nmse.unwrap() > 1e-7);
        // NaN where the reference is finite fails whatever the threshold.
        let mut nan = exp.clone();
        nan[3] = f64::NAN;
        assert!(matches!(compare(&nan, &exp, 1.0).0, Outcome::Failed(_)));
        // Matching infinities pass; a sign flip does not.
        let mut inf = exp.clone();
        inf[5] = f64::NEG_INFINITY;
        assert_eq!(compare(&inf, &inf, 1e-7).0, Outcome::Passed);
        let mut pinf = inf.clone();
        pinf[5] = f64::INFINITY;
        assert!(matches!(compare(&pinf, &inf, 1.0).0, Outcome::Failed(_)));
        assert!(matches!(
            compare(&exp[..5], &exp, 1.0).0,
            Outcome::Failed(_)
        ));
        assert!(matches!(
            compare_exact(&[1.0, 2.0], &[1.0, 3.0]).0,
            Outcome::Failed(_)
        ));
    }

    #[test]
    fn distinct_indices_are_distinct() {
        let mut rng = StdRng::seed_from_u64(1);
        let v = gen_values(&mut rng, [5, 3, 2, 1], Init::Distinct(7));
        for col in v.chunks(5) {
            let mut c: Vec<i64> = col.iter().map(|&x| x as i64).collect();
            assert!(c.iter().all(|&x| (0..7).contains(&x)));
            c.sort_unstable();
            c.dedup();
            assert_eq!(c.len(), 5);
        }
    }
}
