//! Writes the seeds of the RPC server fuzz target (`crates/rgml-rpc/fuzz`, run by
//! `scripts/fuzz-rpc.sh`): whole client conversations the server serves to the end (see
//! `tests/common/seeds.rs`).
//!
//! Usage: `cargo run -p rgml-rpc --example rpc_fuzz_seeds -- DIR`

#[path = "../tests/common/seeds.rs"]
mod seeds;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: rpc_fuzz_seeds DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in seeds::seeds() {
        std::fs::write(dir.join(format!("{name}.bin")), bytes)?;
    }
    Ok(())
}
