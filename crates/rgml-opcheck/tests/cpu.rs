//! Every case on the CPU backend: the suite's main purpose.

use rgml_opcheck::{run_tests, support_table, Outcome};

/// Every case on the CPU backend with the arithmetic of each instruction set rgml mirrors
/// (AVX-512's runs on any x86-64 CPU; AVX2's SIMD paths where the CPU has them).
#[test]
fn cpu_passes_every_case_on_each_instruction_set() {
    rgml_cpu::register();
    for spec in ["CPU:isa=avx2", "CPU:isa=avx512"] {
        let mut be = rgml::registry::init_backend(spec).unwrap();
        let mut failed = Vec::new();
        let mut unsupported_mul_mat = Vec::new();
        let s = run_tests(be.as_mut(), None, &mut |r| match &r.outcome {
            Outcome::Failed(why) => failed.push(format!("{}: {why}", r.name)),
            Outcome::Unsupported if r.name.starts_with("MUL_MAT") => {
                unsupported_mul_mat.push(r.name.clone())
            }
            _ => {}
        })
        .unwrap();
        eprintln!(
            "{spec}: {} passed, {} failed, {} unsupported",
            s.passed, s.failed, s.unsupported
        );
        assert!(
            failed.is_empty(),
            "{spec}: {} failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
        assert_eq!(s.failed, 0);
        assert!(s.passed >= 400, "{spec}: only {} cases passed", s.passed);
        // Every weight type is multiplied, not skipped.
        assert!(
            unsupported_mul_mat.is_empty(),
            "{spec}: MUL_MAT unsupported: {unsupported_mul_mat:?}"
        );
    }
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
