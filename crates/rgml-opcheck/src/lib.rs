//! rgml-opcheck: the op conformance suite (ggml's test-backend-ops).
//!
//! Every case in [`all_cases`] builds a small graph around one op; the runner fills its inputs
//! with seeded random data, allocates it in the backend's default buffer type (the output
//! alone between sentinel bytes), computes it on the backend and compares the result with a
//! float64 reference interpreter written here, independent of any backend ([`reference`]).
//! Results pass when their normalized mean squared error is under the case's threshold; NaN and
//! infinity must match exactly, integer outputs must be equal.
//!
//! Modules: [`cases`] owns the table, [`reference`] the op semantics, [`runner`] allocation,
//! comparison, the support table and timings, [`codec`] dtype conversions.
#![warn(missing_docs)]

pub mod cases;
pub mod codec;
pub mod reference;
pub mod runner;

pub use cases::{all_cases, model_shape_cases, Case};
pub use runner::{
    compare, run_case, run_perf, run_perf_cases, run_tests, support_table, PerfReport,
};

/// What the suite does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Check every case against the reference.
    Test,
    /// Print which case families each backend supports.
    Support,
    /// Time every case.
    Perf,
    /// Time MUL_MAT at a real model's shapes ([`model_shape_cases`]): the kernels' speed at the
    /// sizes that matter, with no reference computed.
    PerfModel,
}

impl Mode {
    /// Parse `test`, `support`, `perf` or `perf-model`.
    pub fn from_name(name: &str) -> Option<Mode> {
        match name.to_ascii_lowercase().as_str() {
            "test" => Some(Mode::Test),
            "support" => Some(Mode::Support),
            "perf" => Some(Mode::Perf),
            "perf-model" => Some(Mode::PerfModel),
            _ => None,
        }
    }
}

/// The result of one case.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Within the threshold.
    Passed,
    /// Wrong, with the reason.
    Failed(String),
    /// The backend does not support the case's ops.
    Unsupported,
}

/// One case's report.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// Case name.
    pub name: String,
    /// Op under test.
    pub op: rgml::OpKind,
    /// What happened.
    pub outcome: Outcome,
    /// Normalized mean squared error against the reference, when computed.
    pub nmse: Option<f64>,
}

/// Counts over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Cases within threshold.
    pub passed: usize,
    /// Cases outside threshold or erroring.
    pub failed: usize,
    /// Cases the backend does not support.
    pub unsupported: usize,
}
