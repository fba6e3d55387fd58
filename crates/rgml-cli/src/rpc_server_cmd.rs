//! `rgml rpc-server`: serve this machine's devices over ggml's RPC protocol (rgml-rpc's
//! server), to llama.cpp's `--rpc` or rgml's own.
//!
//! This module turns flags and the environment (`XDG_CACHE_HOME`, `HOME` for `-c`) into
//! [`rgml_rpc::server::ServerOptions`]; the serving itself is the library's.

use crate::error::CliError;
use clap::Args;
use rgml::backend::DeviceType;
use std::net::TcpListener;
use std::path::PathBuf;

/// Flags of `rgml rpc-server`.
#[derive(Args, Debug, Clone)]
pub struct RpcServerArgs {
    /// Address to listen on. Anything but loopback exposes the devices to the network: the
    /// protocol has no authentication.
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(short = 'p', long, default_value_t = 50052)]
    pub port: u16,
    /// Devices to serve, comma-separated (default: the discrete GPUs, else `CPU`).
    #[arg(long)]
    pub device: Option<String>,
    /// Compute threads of the CPU device (default: all cores).
    #[arg(short = 't', long, value_parser = crate::model_cmds::parse_threads)]
    pub threads: Option<usize>,
    /// Keep tensors clients mark for caching in a local file cache
    /// (`$XDG_CACHE_HOME/rgml/rpc`), so a reload skips sending them.
    #[arg(short = 'c', long)]
    pub cache: bool,
    /// MiB of buffers one client may hold (default: the served devices' total memory).
    #[arg(long)]
    pub client_mem: Option<usize>,
    /// Clients served at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_clients: u16,
}

fn devices(list: Option<&str>) -> Result<Vec<rgml::DeviceRef>, CliError> {
    if let Some(list) = list {
        let names: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Err(CliError::usage("--device: no device named"));
        }
        return names
            .iter()
            .map(|n| {
                rgml::registry::device(n).map_err(|e| CliError::usage(format!("--device: {e}")))
            })
            .collect();
    }
    let gpus: Vec<_> = rgml::registry::devices()
        .into_iter()
        .filter(|d| d.device_type() == DeviceType::Gpu && !d.name().starts_with("RPC"))
        .collect();
    if !gpus.is_empty() {
        return Ok(gpus);
    }
    Ok(vec![rgml::registry::device("CPU")?])
}

fn cache_dir() -> Result<PathBuf, CliError> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| CliError::usage("-c: neither XDG_CACHE_HOME nor HOME is set"))?;
    let dir = base.join("rgml").join("rpc");
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::Message(format!("-c: cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Run the server until it fails.
pub fn run(args: RpcServerArgs) -> Result<bool, CliError> {
    let devices = devices(args.device.as_deref())?;
    let client_memory = match args.client_mem {
        Some(mib) => mib.saturating_mul(1 << 20),
        None => devices.iter().map(|d| d.memory().total).sum(),
    };
    let cache_dir = if args.cache { Some(cache_dir()?) } else { None };
    let endpoint = format!("{}:{}", args.host, args.port);
    let listener = TcpListener::bind(&endpoint)
        .map_err(|e| CliError::Message(format!("cannot listen on {endpoint}: {e}")))?;
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    if !loopback {
        crate::note!(
            "warning: serving on {endpoint}: the RPC protocol has no authentication, anyone who \
             reaches this address can use these devices"
        );
    }
    crate::note!("rgml rpc-server: protocol 7.0.0 on {endpoint}");
    for (i, d) in devices.iter().enumerate() {
        let mem = d.memory();
        crate::note!(
            "  device {i}: {} ({} MiB, {} MiB free)",
            d.name(),
            mem.total >> 20,
            mem.free >> 20
        );
    }
    if let Some(dir) = &cache_dir {
        crate::note!("  cache: {}", dir.display());
    }
    let options = rgml_rpc::server::ServerOptions {
        devices,
        threads: args.threads,
        client_memory,
        max_clients: usize::from(args.max_clients),
        cache_dir,
    };
    rgml_rpc::server::serve(listener, options)
        .map_err(|e| CliError::Message(format!("accepting clients on {endpoint}: {e}")))?;
    Ok(true)
}
