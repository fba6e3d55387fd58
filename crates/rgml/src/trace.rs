//! Timeline recording in the Chrome trace-event format (viewable in Perfetto or
//! `chrome://tracing`): one track per backend, with spans for splits, copies and kernels, and
//! arguments such as bytes copied.
//!
//! This module owns the recorder and its JSON writer only; the scheduler and backends decide
//! what to record. Recording is cheap (a lock and a push), and nothing is recorded unless a
//! caller holds a [`Trace`].

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

/// A value attached to a span.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceArg {
    /// An integer (bytes, counts).
    Int(u64),
    /// Text.
    Text(String),
}

/// One complete span on a track.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSpan {
    /// Track index from [`Trace::track`].
    pub track: usize,
    /// Span name (`"split 3"`, `"copy inp_embd"`, `"MUL_MAT"`).
    pub name: String,
    /// Category (`"split"`, `"copy"`, `"kernel"`).
    pub category: &'static str,
    /// Start, microseconds since the trace began.
    pub start_us: f64,
    /// Duration in microseconds.
    pub duration_us: f64,
    /// Extra values.
    pub args: Vec<(String, TraceArg)>,
}

#[derive(Default)]
struct Inner {
    tracks: Vec<String>,
    spans: Vec<TraceSpan>,
}

/// A recorder of spans on named tracks.
pub struct Trace {
    origin: Instant,
    inner: Mutex<Inner>,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("spans", &self.spans().len())
            .finish()
    }
}

impl Trace {
    /// An empty trace starting now.
    pub fn new() -> Trace {
        Trace {
            origin: Instant::now(),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index of the track called `name`, created on first use (e.g. one per backend).
    pub fn track(&self, name: &str) -> usize {
        let mut inner = self.lock();
        if let Some(i) = inner.tracks.iter().position(|t| t == name) {
            return i;
        }
        inner.tracks.push(name.to_string());
        inner.tracks.len() - 1
    }

    /// Record a span from `start` to `end` on `track`.
    pub fn span(
        &self,
        track: usize,
        name: impl Into<String>,
        category: &'static str,
        start: Instant,
        end: Instant,
        args: Vec<(String, TraceArg)>,
    ) {
        let us = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        let span = TraceSpan {
            track,
            name: name.into(),
            category,
            start_us: us(start),
            duration_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            args,
        };
        self.lock().spans.push(span);
    }

    /// Record `span`, whose `start_us` counts from `anchor` rather than from the trace's start:
    /// for times measured on another clock (a GPU's timestamps), placed on this trace's
    /// timeline relative to a host instant.
    pub fn span_at(&self, anchor: Instant, mut span: TraceSpan) {
        span.start_us += anchor.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        self.lock().spans.push(span);
    }

    /// The track names, by index.
    pub fn tracks(&self) -> Vec<String> {
        self.lock().tracks.clone()
    }

    /// The recorded spans.
    pub fn spans(&self) -> Vec<TraceSpan> {
        self.lock().spans.clone()
    }

    /// The trace as Chrome trace-event JSON: a `thread_name` metadata event per track, then a
    /// complete (`"X"`) event per span.
    pub fn to_chrome_json(&self) -> String {
        let inner = self.lock();
        let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push(',');
            }
            first = false;
        };
        for (tid, name) in inner.tracks.iter().enumerate() {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                json_string(name)
            );
        }
        for s in &inner.spans {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{",
                json_string(&s.name),
                json_string(s.category),
                s.track,
                s.start_us,
                s.duration_us
            );
            for (i, (k, v)) in s.args.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let value = match v {
                    TraceArg::Int(n) => n.to_string(),
                    TraceArg::Text(t) => json_string(t),
                };
                let _ = write!(out, "{}:{value}", json_string(k));
            }
            out.push_str("}}");
        }
        out.push_str("]}");
        out
    }

    /// Write [`Trace::to_chrome_json`] to `path`.
    pub fn write(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_chrome_json())
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn spans_at_an_anchor_land_after_it() {
        let trace = Trace::new();
        let gpu = trace.track("Vulkan0 kernels");
        let anchor = trace.origin + Duration::from_micros(1000);
        let span = |start_us, duration_us| TraceSpan {
            track: gpu,
            name: "MUL_MAT".into(),
            category: "kernel",
            start_us,
            duration_us,
            args: vec![],
        };
        trace.span_at(anchor, span(5.0, 2.5));
        trace.span_at(anchor, span(7.5, 1.0));
        let spans = trace.spans();
        assert_eq!(spans.len(), 2);
        assert!((spans[0].start_us - 1005.0).abs() < 1e-6, "{spans:?}");
        assert!((spans[1].start_us - 1007.5).abs() < 1e-6, "{spans:?}");
        assert_eq!(spans[0].duration_us, 2.5);
    }

    #[test]
    fn chrome_json_has_tracks_and_spans() {
        let trace = Trace::new();
        let cpu0 = trace.track("CPU0");
        let cpu1 = trace.track("CPU1");
        assert_eq!(trace.track("CPU0"), cpu0, "tracks are reused by name");
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_micros(250);
        trace.span(cpu0, "split 0", "split", t0, t1, vec![]);
        trace.span(
            cpu1,
            "copy \"x\"\n",
            "copy",
            t1,
            t1 + Duration::from_micros(10),
            vec![
                ("bytes".into(), TraceArg::Int(4096)),
                ("from".into(), TraceArg::Text("CPU0".into())),
            ],
        );
        let json: serde_json::Value =
            serde_json::from_str(&trace.to_chrome_json()).expect("valid JSON");
        let events = json["traceEvents"].as_array().expect("events");
        assert_eq!(events.len(), 4);
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "M")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert_eq!(names, ["CPU0", "CPU1"]);
        let copy = events
            .iter()
            .find(|e| e["cat"] == "copy")
            .expect("copy span");
        assert_eq!(copy["name"], "copy \"x\"\n");
        assert_eq!(copy["tid"], 1);
        assert_eq!(copy["args"]["bytes"], 4096);
        let split = events
            .iter()
            .find(|e| e["cat"] == "split")
            .expect("split span");
        assert!((split["dur"].as_f64().unwrap() - 250.0).abs() < 1.0);
        assert!(copy["ts"].as_f64().unwrap() >= split["ts"].as_f64().unwrap() + 249.0);
    }
}
