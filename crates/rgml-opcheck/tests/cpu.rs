//! Every case on the CPU backend: the suite's main purpose.

use rgml_opcheck::{run_tests, support_table, Outcome};

#[test]
fn cpu_passes_every_case() {
    rgml_cpu::register();
    let mut be = rgml::registry::init_backend("CPU").unwrap();
    let mut failed = Vec::new();
    let s = run_tests(be.as_mut(), None, &mut |r| {
        if let Outcome::Failed(why) = &r.outcome {
            failed.push(format!("{}: {why}", r.name));
        }
    })
    .unwrap();
    eprintln!(
        "CPU: {} passed, {} failed, {} unsupported",
        s.passed, s.failed, s.unsupported
    );
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert_eq!(s.failed, 0);
    assert!(s.passed >= 400, "only {} cases passed", s.passed);
}

#[test]
fn cpu_support_table_has_a_column() {
    rgml_cpu::register();
    let mut backends = vec![rgml::registry::init_backend("CPU").unwrap()];
    let table = support_table(&mut backends, Some(rgml::OpKind::MulMat)).unwrap();
    let header = table.lines().next().unwrap();
    assert!(header.contains("CPU"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("MUL_MAT type_a=q4_0")),
        "{table}"
    );
}
