//! `/metrics`: the generator's [`Stats`] (and open connections) in Prometheus' text
//! exposition format 0.0.4.

use crate::generator::Stats;
use std::fmt::Write;

/// The `Content-Type` of the exposition format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric's kind.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// The exposition of `stats`, and of `connections` (open HTTP connections) when known.
pub(crate) fn render(stats: &Stats, connections: Option<usize>) -> String {
    let metrics: [(&str, Kind, &str, f64); 11] = [
        (
            "rgml_requests_total",
            Kind::Counter,
            "Generation requests accepted.",
            stats.requests_total as f64,
        ),
        (
            "rgml_requests_finished_total",
            Kind::Counter,
            "Generation requests ended (any reason, cancelled and failed included).",
            stats.requests_finished as f64,
        ),
        (
            "rgml_requests_cancelled_total",
            Kind::Counter,
            "Generation requests cancelled by their client.",
            stats.requests_cancelled as f64,
        ),
        (
            "rgml_prompt_tokens_total",
            Kind::Counter,
            "Prompt tokens evaluated (cached ones not counted).",
            stats.prompt_tokens_total as f64,
        ),
        (
            "rgml_generated_tokens_total",
            Kind::Counter,
            "Tokens generated.",
            stats.generated_tokens_total as f64,
        ),
        (
            "rgml_prompt_seconds_total",
            Kind::Counter,
            "Seconds spent computing batches with prompt tokens.",
            stats.prompt_seconds_total,
        ),
        (
            "rgml_generation_seconds_total",
            Kind::Counter,
            "Seconds spent computing generation-only batches.",
            stats.generation_seconds_total,
        ),
        (
            "rgml_slots",
            Kind::Gauge,
            "Slots (sequences decoded together).",
            stats.n_slots as f64,
        ),
        (
            "rgml_slots_busy",
            Kind::Gauge,
            "Slots running a request.",
            stats.slots_busy as f64,
        ),
        (
            "rgml_queue_length",
            Kind::Gauge,
            "Requests waiting for a slot.",
            stats.queue_len as f64,
        ),
        (
            "rgml_generated_tokens_per_second",
            Kind::Gauge,
            "Generated tokens per second over the last few seconds.",
            stats.generated_tokens_per_second,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, value) in metrics {
        metric(&mut out, name, kind, help, value);
    }
    if let Some(open) = connections {
        let help = "Open HTTP connections.";
        metric(
            &mut out,
            "rgml_http_connections",
            Kind::Gauge,
            help,
            open as f64,
        );
    }
    out
}

fn metric(out: &mut String, name: &str, kind: Kind, help: &str, value: f64) {
    let kind = match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    };
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {}", number(value));
}

/// A sample value as Prometheus spells it (`+Inf`, `-Inf`, `NaN`; Rust's shortest
/// round-trip decimal otherwise).
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{value}")
    }
}
