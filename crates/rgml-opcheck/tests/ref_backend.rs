//! The runner itself under test: a backend that computes with the reference interpreter must
//! pass every case, and the same backend with a deliberate fault must be caught.

use rgml::backend::{BackendParams, Device, DeviceRef};
use rgml::backend::{DeviceCaps, DeviceMemory, DeviceType};
use rgml::{Backend, BufferTypeRef, Context, Graph, OpKind, Result, TensorId};
use rgml_opcheck::reference::{eval_node, Mem};
use rgml_opcheck::{codec, run_tests, support_table, Outcome};
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Scale every result of this op by 1.05 (NMSE 2.5e-3, above MUL_MAT's 5e-4).
    Perturb(OpKind),
    /// Write a NaN into every result of this op.
    Nan(OpKind),
    /// Write 4 bytes past the end of every result of this op.
    Overrun(OpKind),
    /// Claim not to support this op.
    Unsupported(OpKind),
}

struct RefDevice {
    bt: BufferTypeRef,
    fault: Fault,
}

impl Device for RefDevice {
    fn name(&self) -> &str {
        "Ref"
    }
    fn description(&self) -> &str {
        "reference interpreter"
    }
    fn memory(&self) -> DeviceMemory {
        DeviceMemory::default()
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Accel
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    fn init_backend(&self, _params: &BackendParams) -> Result<Box<dyn Backend>> {
        unimplemented!()
    }
    fn buffer_type(&self) -> BufferTypeRef {
        self.bt.clone()
    }
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.fault != Fault::Unsupported(ctx[id].op.kind())
    }
    fn supports_buffer_type(&self, _bt: &BufferTypeRef) -> bool {
        true
    }
}

struct RefBackend {
    dev: Arc<RefDevice>,
}

impl RefBackend {
    fn new(fault: Fault) -> Self {
        RefBackend {
            dev: Arc::new(RefDevice {
                bt: rgml::testing::VecBufferType::new("RefHost")
                    .device_only()
                    .shared(),
                fault,
            }),
        }
    }
}

impl Backend for RefBackend {
    fn name(&self) -> &str {
        "Ref"
    }
    fn device(&self) -> DeviceRef {
        self.dev.clone()
    }
    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let mut mem = Mem::new();
        for id in ctx.ids() {
            let t = &ctx[id];
            if t.view_src.is_none() && t.data.is_some() {
                mem.load(ctx, id, &ctx.tensor_bytes(id)?)?;
            }
        }
        for &id in graph.nodes() {
            let kind = ctx[id].op.kind();
            if kind.is_view() {
                continue;
            }
            eval_node(ctx, id, &mut mem)?;
            let root = ctx[id].view_src.unwrap_or(id);
            let rt = &ctx[root];
            let mut vals: Vec<f32> = mem.root(root).unwrap().iter().map(|&v| v as f32).collect();
            match self.dev.fault {
                Fault::Perturb(k) if k == kind => vals.iter_mut().for_each(|v| *v *= 1.05),
                Fault::Nan(k) if k == kind => {
                    let mid = vals.len() / 2;
                    vals[mid] = f32::NAN
                }
                _ => {}
            }
            ctx.tensor_set(root, 0, &codec::encode(rt.dtype, &vals)?)?;
            if self.dev.fault == Fault::Overrun(kind) {
                let data = rt.data.as_ref().unwrap();
                data.buffer.set(data.offset + rt.nbytes(), &[0, 0, 0, 0])?;
            }
        }
        Ok(())
    }
}

fn failures(fault: Fault, op: OpKind) -> (rgml_opcheck::Summary, Vec<String>) {
    let mut be = RefBackend::new(fault);
    let mut failed = Vec::new();
    let s = run_tests(&mut be, Some(op), &mut |r| {
        if let Outcome::Failed(why) = &r.outcome {
            failed.push(format!("{}: {why}", r.name));
        }
    })
    .unwrap();
    (s, failed)
}

#[test]
fn reference_backend_passes_every_case() {
    let mut be = RefBackend::new(Fault::None);
    let mut failed = Vec::new();
    let s = run_tests(&mut be, None, &mut |r| {
        if let Outcome::Failed(why) = &r.outcome {
            failed.push(format!("{}: {why}", r.name));
        }
    })
    .unwrap();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(s.unsupported, 0);
    assert!(s.passed >= 300, "{s:?}");
}

#[test]
fn faults_are_caught() {
    let (s, f) = failures(Fault::Perturb(OpKind::MulMat), OpKind::MulMat);
    assert_eq!(s.passed, 0, "perturbed MUL_MAT passed: {s:?}");
    assert!(f.iter().all(|m| m.contains("NMSE")), "{f:?}");

    let (s, f) = failures(Fault::Nan(OpKind::SoftMax), OpKind::SoftMax);
    assert_eq!(s.passed, 0, "NaN in SOFT_MAX passed");
    assert!(f.iter().all(|m| m.contains("got NaN")), "{f:?}");

    let (s, f) = failures(Fault::Overrun(OpKind::Add), OpKind::Add);
    assert_eq!(s.passed, 0);
    assert!(f.iter().all(|m| m.contains("past the end")), "{f:?}");

    let (s, _) = failures(Fault::Unsupported(OpKind::Rope), OpKind::Rope);
    assert_eq!((s.passed, s.failed), (0, 0));
    assert!(s.unsupported > 10);
}

#[test]
fn support_table_marks_unsupported_families() {
    let mut backends: Vec<Box<dyn Backend>> = vec![
        Box::new(RefBackend::new(Fault::None)),
        Box::new(RefBackend::new(Fault::Unsupported(OpKind::Gelu))),
    ];
    let table = support_table(&mut backends, None).unwrap();
    let gelu = table.lines().find(|l| l.starts_with("GELU")).unwrap();
    assert!(gelu.ends_with("yes        no"), "{gelu}");
    let silu = table.lines().find(|l| l.starts_with("SILU")).unwrap();
    assert!(silu.ends_with("yes       yes"), "{silu}");
    // A graph with GELU behind a CONT is only partly supported where GELU is not.
    assert!(table.lines().count() > 40, "{table}");
}

#[test]
fn perf_mode_times_supported_cases() {
    let mut be = RefBackend::new(Fault::Unsupported(OpKind::Silu));
    let mut lines = Vec::new();
    rgml_opcheck::run_perf(&mut be, Some(OpKind::Silu), 1, &mut |r| {
        lines.push(r.line())
    })
    .unwrap();
    assert!(
        lines.iter().all(|l| l.ends_with("unsupported")),
        "{lines:?}"
    );
    let mut reps = Vec::new();
    let mut be = RefBackend::new(Fault::None);
    rgml_opcheck::run_perf(&mut be, Some(OpKind::MulMat), 1, &mut |r| {
        reps.push(r.clone())
    })
    .unwrap();
    assert!(!reps.is_empty());
    for r in &reps {
        assert!(r.us_per_run.is_some_and(|us| us > 0.0), "{}", r.line());
        assert!(r.flops > 0.0 && r.line().contains("GFLOPS"), "{}", r.line());
    }
}
