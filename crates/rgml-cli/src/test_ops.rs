//! `rgml test-ops`: run the op conformance suite (rgml-opcheck) on registered backends.
//!
//! This module registers nothing: the CLI registers its backends before calling [`run`]. It only
//! resolves names, runs the suite and prints; the checks themselves live in rgml-opcheck.

use crate::error::CliError;
use crate::output::Out;
use rgml::backend::BackendParams;
use rgml::{registry, Backend, OpKind};
use rgml_opcheck::{Mode, Outcome};

/// Set to print every case, not only failures.
const VERBOSE_ENV: &str = "RGML_TEST_OPS_VERBOSE";
/// Milliseconds spent timing each case in perf mode.
const PERF_BUDGET_MS: u64 = 20;

fn open_backends(name: Option<&str>) -> Result<Vec<Box<dyn Backend>>, String> {
    match name {
        // A device name, whatever characters it holds.
        Some(name) => Ok(vec![registry::device(name)
            .and_then(|d| d.init_backend(&BackendParams::default()))
            .map_err(|e| e.to_string())?]),
        None => {
            let devices = registry::devices();
            if devices.is_empty() {
                return Err("no backends are registered".into());
            }
            devices
                .iter()
                .map(|d| {
                    d.init_backend(&BackendParams::default())
                        .map_err(|e| format!("{}: {e}", d.name()))
                })
                .collect()
        }
    }
}

fn parse_op(op: Option<&str>) -> Result<Option<OpKind>, String> {
    let Some(name) = op else {
        return Ok(None);
    };
    match OpKind::from_name(name) {
        Some(k) if k != OpKind::None => Ok(Some(k)),
        _ => {
            let valid: Vec<&str> = OpKind::ALL
                .iter()
                .filter(|k| **k != OpKind::None)
                .map(|k| k.name())
                .collect();
            Err(format!("unknown op '{name}' (valid: {})", valid.join(", ")))
        }
    }
}

/// Run the suite in `mode` (`test`, `support`, `perf` or `perf-model`) on `backend` (a registered device
/// name, optionally with `:key=value` parameters; `None` = every registered device), only for
/// `op` if given. Prints a line per failed case and ends with `{passed} passed, {failed} failed`.
/// Returns `Ok(true)` when nothing failed.
pub fn run(backend: Option<&str>, op: Option<&str>, mode: &str) -> Result<bool, CliError> {
    let mode = Mode::from_name(mode).ok_or_else(|| {
        CliError::usage(format!(
            "unknown mode '{mode}' (valid: test, support, perf, perf-model)"
        ))
    })?;
    let op = parse_op(op).map_err(CliError::Usage)?;
    let mut backends = open_backends(backend).map_err(CliError::Usage)?;
    let mut out = Out::new();
    let ok = run_mode(mode, op, &mut backends, &mut out)?;
    out.finish()?;
    Ok(ok)
}

fn run_mode(
    mode: Mode,
    op: Option<OpKind>,
    backends: &mut [Box<dyn Backend>],
    out: &mut Out,
) -> Result<bool, CliError> {
    match mode {
        Mode::Support => {
            let table = rgml_opcheck::support_table(backends, op).map_err(|e| e.to_string())?;
            out.text(&table);
            Ok(true)
        }
        Mode::Perf | Mode::PerfModel => {
            for be in backends.iter_mut() {
                out.line(format_args!("Backend {}:", be.name()));
                let mut line =
                    |r: &rgml_opcheck::PerfReport| out.line(format_args!("  {}", r.line()));
                if mode == Mode::Perf {
                    rgml_opcheck::run_perf(be.as_mut(), op, PERF_BUDGET_MS, &mut line)
                } else {
                    let cases = rgml_opcheck::model_shape_cases()
                        .into_iter()
                        .filter(|c| op.is_none_or(|o| c.op == o));
                    rgml_opcheck::run_perf_cases(be.as_mut(), cases, PERF_BUDGET_MS, &mut line)
                }
                .map_err(|e| e.to_string())?;
            }
            Ok(true)
        }
        Mode::Test => {
            let verbose = std::env::var_os(VERBOSE_ENV).is_some_and(|v| v != "0");
            let (mut passed, mut failed, mut unsupported) = (0, 0, 0);
            for be in backends.iter_mut() {
                let name = be.name().to_string();
                out.line(format_args!("Backend {name}:"));
                let s = rgml_opcheck::run_tests(be.as_mut(), op, &mut |r| match &r.outcome {
                    Outcome::Failed(why) => out.line(format_args!("  FAIL {}: {why}", r.name)),
                    Outcome::Passed if verbose => out.line(format_args!(
                        "  ok   {} (nmse {:.2e})",
                        r.name,
                        r.nmse.unwrap_or(0.0)
                    )),
                    Outcome::Unsupported if verbose => out.line(format_args!("  n/a  {}", r.name)),
                    _ => {}
                })
                .map_err(|e| e.to_string())?;
                out.line(format_args!(
                    "  {name}: passed={}, failed={}, unsupported={}",
                    s.passed, s.failed, s.unsupported
                ));
                passed += s.passed;
                failed += s.failed;
                unsupported += s.unsupported;
            }
            out.line(format_args!("{unsupported} unsupported"));
            out.line(format_args!("{passed} passed, {failed} failed"));
            Ok(failed == 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_errors_listing_valid_ones() {
        let e = run(None, None, "fast").unwrap_err().to_string();
        assert!(e.contains("test, support, perf"), "{e}");
        let e = run(None, Some("MATMUL"), "test").unwrap_err().to_string();
        assert!(e.contains("MUL_MAT") && e.contains("SOFT_MAX"), "{e}");
        let e = run(Some("NoSuchDevice"), None, "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown device 'NoSuchDevice'"), "{e}");
    }
}
