//! The RPC server on arbitrary client bytes: a whole conversation (frames of requests) is
//! decoded, checked and served against the CPU device, graphs rebuilt and computed, with a
//! 1 MiB memory cap. Any outcome but a panic, a hang or memory unsafety is fine: a refusal
//! ends the conversation as it would end a connection.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rgml_rpc::server::{serve_stream, ServerOptions};
use std::sync::OnceLock;

fn options() -> &'static ServerOptions {
    static OPTIONS: OnceLock<ServerOptions> = OnceLock::new();
    OPTIONS.get_or_init(|| {
        rgml_cpu::register();
        let cpu = rgml::registry::device("CPU").expect("the CPU device");
        ServerOptions {
            devices: vec![cpu],
            threads: Some(1),
            client_memory: 1 << 20,
            max_clients: 1,
            cache_dir: None,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = serve_stream(data, std::io::sink(), options());
});
