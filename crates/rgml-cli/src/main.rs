//! The `rgml` command line: device listing and op conformance (model commands come with the
//! model crate). Backends are registered here, so the binary links only what it uses.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod test_ops;

#[derive(Parser)]
#[command(name = "rgml", version, about = "A multi-backend tensor runtime")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the devices of every registered backend.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check every op against a float64 reference on one or all backends.
    TestOps {
        /// Backend (device name from `rgml devices`); default: all.
        #[arg(short = 'b', long)]
        backend: Option<String>,
        /// Only cases of this op (e.g. MUL_MAT).
        #[arg(short = 'o', long)]
        op: Option<String>,
        /// test: compare with the reference; support: print the op × backend table; perf: time cases.
        #[arg(long, default_value = "test", value_parser = ["test", "support", "perf"])]
        mode: String,
    },
}

fn register_backends() {
    rgml_cpu::register();
}

fn devices(json: bool) -> Result<(), String> {
    let devices = rgml::registry::devices();
    if json {
        let list: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| {
                let mem = d.memory();
                serde_json::json!({
                    "name": d.name(),
                    "description": d.description(),
                    "type": d.device_type().name(),
                    "memory_free": mem.free,
                    "memory_total": mem.total,
                    "buffer_type": d.buffer_type().name(),
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?;
        println!("{text}");
        return Ok(());
    }
    println!("{} device(s):", devices.len());
    for d in &devices {
        let mem = d.memory();
        println!(
            "  {:<10} {:<6} {:>8} MiB free / {:>8} MiB  {}",
            d.name(),
            d.device_type().name(),
            mem.free >> 20,
            mem.total >> 20,
            d.description()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    register_backends();
    let result = match cli.command {
        Command::Devices { json } => devices(json).map(|()| true),
        Command::TestOps { backend, op, mode } => {
            test_ops::run(backend.as_deref(), op.as_deref(), &mode)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
