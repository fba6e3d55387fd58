//! `rgml compare`: run the model's prompt graph on two devices node by node and report where they
//! diverge ([`rgml::compare::compare_graph_backend`]).
//!
//! The model is loaded on the host CPU only to build the graph and hold the weights; the
//! comparison copies the graph (weights, inputs and KV cache included) into each device's own
//! memory. (The comparison itself is tested against a deliberately wrong backend in
//! `rgml-llm`'s tests, with rgml-cpu's test-only `testing` feature; the binary never has it.)

use crate::error::CliError;
use crate::output::Out;
use clap::Args;
use rgml_llm::{EncodeOptions, FlashAttn, LoadOptions, Model, Placement, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::Arc;

/// Flags of `rgml compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// GGUF model file.
    #[arg(short = 'm', long, default_value = crate::model_cmds::DEFAULT_MODEL)]
    model: PathBuf,
    /// Prompt whose graph is compared.
    #[arg(short = 'p', long, default_value = "Hello")]
    prompt: String,
    /// Two devices from `rgml devices`: reference,tested (e.g. `CPU0,CPU1`).
    #[arg(long)]
    pub(crate) device: String,
    /// A node diverges when its NMSE against the reference exceeds this. The default, 0,
    /// reports any difference: two devices that mirror the same arithmetic agree bit for bit
    /// (e.g. `1e-6` passes rounding differences between instruction sets).
    #[arg(long, default_value_t = 0.0)]
    tol: f64,
    /// Compute threads per device, 1 to 256 (default: all cores).
    #[arg(short = 't', long, value_parser = crate::model_cmds::parse_threads)]
    threads: Option<usize>,
    /// Print every node, not only divergent ones.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Flash attention in the compared graph (also `-fa`): `on`, `off` or `auto` (on where
    /// both devices compute it).
    #[arg(long = "flash-attn", value_name = "on|off|auto", default_value = "auto", value_parser = crate::model_cmds::parse_flash_attn)]
    flash_attn: FlashAttn,
}

/// Run `rgml compare`; `Ok(false)` when a node diverged.
pub fn run(args: CompareArgs) -> Result<bool, CliError> {
    let names: Vec<&str> = args
        .device
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let [dev1, dev2] = names.as_slice() else {
        return Err(CliError::usage(format!(
            "--device {}: give exactly two devices, e.g. CPU0,CPU1",
            args.device
        )));
    };
    if !args.tol.is_finite() || args.tol < 0.0 {
        return Err(CliError::usage(format!(
            "--tol {}: must be a finite number >= 0",
            args.tol
        )));
    }
    if !args.model.exists() {
        return Err(CliError::usage(format!(
            "model file {} not found (run scripts/fetch-model.sh for the demo model)",
            args.model.display()
        )));
    }
    // Devices by name (any characters), parameters as values.
    let open = |name: &str| -> Result<Box<dyn rgml::Backend>, CliError> {
        let device =
            rgml::registry::device(name).map_err(|e| CliError::usage(format!("--device: {e}")))?;
        let mut params = rgml::backend::BackendParams::default();
        if let Some(t) = args
            .threads
            .filter(|_| device.device_type() == rgml::backend::DeviceType::Cpu)
        {
            params.set("n_threads", t);
        }
        Ok(device.init_backend(&params)?)
    };
    let mut backend1 = open(dev1)?;
    let mut backend2 = open(dev2)?;

    let host = rgml::registry::device("CPU")?;
    let options = LoadOptions {
        overrides: Vec::new(),
        placement: Some(Placement::Single(host)),
        ..Default::default()
    };
    let model = Arc::new(Model::load(&args.model, options)?);
    let tokens = model
        .tokenizer
        .encode(&args.prompt, EncodeOptions::prompt());
    if tokens.is_empty() {
        return Err("the prompt is empty".into());
    }
    let flash_attn = match args.flash_attn {
        FlashAttn::Auto => {
            let (probe, fa) = rgml_llm::flash_attn_probe(&model.config)?;
            let both = [&backend1, &backend2]
                .iter()
                .all(|b| b.device().supports_op(&probe, fa));
            if both {
                FlashAttn::On
            } else {
                FlashAttn::Off
            }
        }
        chosen => chosen,
    };
    let mut session = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: tokens.len(),
            n_ubatch: tokens.len(),
            n_threads: args.threads,
            device_params: Vec::new(),
            flash_attn,
            ..Default::default()
        },
    )?;
    let (ctx, graph) = session.prompt_graph(&tokens)?;

    let (tol, verbose) = (args.tol, args.verbose);
    let mut out = Out::new();
    let report = rgml::compare::compare_graph_backend(
        ctx,
        &graph,
        backend1.as_mut(),
        backend2.as_mut(),
        tol,
        &mut |c| {
            let diverges = c.diverges(tol);
            if verbose || diverges {
                out.line(format_args!(
                    "#{:<5} {:<24} {:<14} nmse={:.3e} max_abs={:.3e}{}{}",
                    c.index,
                    c.name,
                    c.op.name(),
                    c.nmse,
                    c.max_abs,
                    if c.nonfinite_mismatch {
                        " nan/inf-mismatch"
                    } else {
                        ""
                    },
                    if diverges { "  DIVERGES" } else { "" }
                ));
            }
            true
        },
    )?;
    let first = match &report.first_divergent {
        None => "none".to_string(),
        Some(c) => format!(
            "#{} {} ({}) nmse={:.3e}",
            c.index,
            c.name,
            c.op.name(),
            c.nmse
        ),
    };
    out.line(format_args!(
        "compared {} nodes, first divergent: {first} ({} divergent; {} vs {}, tol {:e})",
        report.n_nodes_compared,
        report.n_divergent,
        backend1.name(),
        backend2.name(),
        tol
    ));
    out.finish()?;
    Ok(report.first_divergent.is_none())
}
