//! The client against servers that misbehave: a scripted fake server on loopback answers the
//! handshake and then lies, stalls or hangs up, and every such reply must be an error (never a
//! panic or a hang), the connection must stay failed with its first reason, and nothing may be
//! allocated for an absurd announced size. Against llama.cpp's `ggml-rpc-server` (when built,
//! see `crates/rgml-cli/tests/rpc.rs`), bytes round-trip through a remote buffer and a killed
//! server is an error on the next call.

use rgml::backend::Buffer;
use rgml::Device as _;
use rgml_rpc::wire::{read_request, write_response, Command};
use rgml_rpc::RpcServer;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the fake server does with a request after the handshake and the device queries.
type Script = fn(Command, &mut TcpStream) -> bool;

/// A fake server on a free port: it answers HELLO with protocol `version`, DEVICE_COUNT with
/// one device, GET_ALIGNMENT 32, GET_MAX_SIZE and GET_DEVICE_MEMORY 1 GiB, and hands every other request to
/// `script`, until the script returns false (then it hangs up).
fn fake_server(version: [u8; 3], script: Script) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = listener.local_addr().expect("address").to_string();
    let handle = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        while let Ok((cmd, _payload)) = read_request(&mut s, 1 << 20) {
            let reply: Option<Vec<u8>> = match cmd {
                Command::Hello => {
                    let mut r = vec![version[0], version[1], version[2], 0];
                    r.extend_from_slice(&[0; 24]);
                    Some(r)
                }
                Command::DeviceCount => Some(1u32.to_le_bytes().to_vec()),
                Command::GetAlignment => Some(32u64.to_le_bytes().to_vec()),
                Command::GetMaxSize => Some((1u64 << 30).to_le_bytes().to_vec()),
                Command::GetDeviceMemory => Some([(1u64 << 30).to_le_bytes(); 2].concat()),
                other => {
                    if !script(other, &mut s) {
                        return;
                    }
                    None
                }
            };
            if let Some(r) = reply {
                if write_response(&mut s, &r).is_err() {
                    return;
                }
            }
        }
    });
    (endpoint, handle)
}

fn message(e: rgml::Error) -> String {
    e.to_string()
}

#[test]
fn a_server_of_another_protocol_version_is_refused() {
    let (endpoint, handle) = fake_server([8, 0, 0], |_, _| false);
    let err = RpcServer::connect(&endpoint)
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(err.contains("protocol 8.0.0"), "{err}");
    handle.join().expect("server thread");
}

#[test]
fn a_server_that_hangs_up_fails_this_call_and_every_later_one() {
    let (endpoint, handle) = fake_server([7, 0, 0], |_, _| false);
    let server = RpcServer::connect(&endpoint).expect("handshake and device queries");
    let device = server.rpc_devices()[0].clone();
    assert_eq!(device.name(), format!("RPC0[{endpoint}]"));
    let bt = device.buffer_type();
    let first = Buffer::alloc(&bt, 1024)
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(first.contains("connection lost"), "{first}");
    let later = Buffer::alloc(&bt, 1024)
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(later.contains("connection lost earlier"), "{later}");
    // Memory figures cannot fail: an unreachable server has none.
    assert_eq!(device.memory().total, 0);
    handle.join().expect("server thread");
}

#[test]
fn replies_of_the_wrong_size_are_errors() {
    // ALLOC_BUFFER's reply is 16 bytes; 8 is refused.
    let (endpoint, handle) = fake_server([7, 0, 0], |cmd, s| {
        cmd == Command::AllocBuffer && write_response(s, &[1; 8]).is_ok()
    });
    let server = RpcServer::connect(&endpoint).expect("connect");
    let bt = server.rpc_devices()[0].buffer_type();
    let err = Buffer::alloc(&bt, 64)
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(
        err.contains("response") && err.contains("expected 16"),
        "{err}"
    );
    drop(server);
    handle.join().expect("server thread");
}

#[test]
fn an_absurd_announced_reply_is_refused_before_reading_it() {
    // A reply announcing 1 TiB: refused by its size alone, nothing allocated for it.
    let (endpoint, handle) = fake_server([7, 0, 0], |_, s| {
        use std::io::Write;
        s.write_all(&(1u64 << 40).to_le_bytes()).is_ok() && s.flush().is_ok()
    });
    let server = RpcServer::connect(&endpoint).expect("connect");
    let bt = server.rpc_devices()[0].buffer_type();
    let err = Buffer::alloc(&bt, 64)
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(err.contains("over the limit"), "{err}");
    drop(server);
    handle.join().expect("server thread");
}

#[test]
fn a_refused_allocation_is_out_of_memory() {
    // remote_ptr 0: ggml's answer when the device cannot allocate.
    let (endpoint, handle) = fake_server([7, 0, 0], |cmd, s| {
        cmd == Command::AllocBuffer && write_response(s, &[0; 16]).is_ok()
    });
    let server = RpcServer::connect(&endpoint).expect("connect");
    let bt = server.rpc_devices()[0].buffer_type();
    let err = Buffer::alloc(&bt, 1 << 20)
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(err.contains("failed to allocate"), "{err}");
    // The connection is still good: closing it (the last holders) ends the fake server.
    drop(bt);
    drop(server);
    handle.join().expect("server thread");
}

/// llama.cpp's `ggml-rpc-server`, if built (see `crates/rgml-cli/tests/rpc.rs`).
fn ggml_rpc_server() -> Option<PathBuf> {
    let path = std::env::var_os("RGML_GGML_RPC_SERVER")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(
                PathBuf::from(home)
                    .join(".cache/rgml/llamacpp/build-0.3.36-native-noamx-rpc/bin/ggml-rpc-server"),
            )
        })
        .filter(|p| p.exists());
    if path.is_none() {
        let required = std::env::var("RGML_REQUIRE_RPC_SERVER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "RGML_REQUIRE_RPC_SERVER=1 but no ggml-rpc-server"
        );
        eprintln!("no ggml-rpc-server: skipping");
    }
    path
}

#[test]
fn bytes_round_trip_and_a_killed_server_is_an_error_next_call() {
    let Some(binary) = ggml_rpc_server() else {
        return;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = Process::new(binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ggml-rpc-server");
    let endpoint = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let server = loop {
        match RpcServer::connect(&endpoint) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => panic!("never connected: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let bt = server.rpc_devices()[0].buffer_type();
    let buf = Buffer::alloc(&bt, 4096).expect("remote buffer");
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    buf.set(100, &data).expect("set");
    let mut back = vec![0u8; 3000];
    buf.get(100, &mut back).expect("get");
    assert_eq!(back, data);
    buf.memset(200, 0xAB, 10).expect("memset");
    let mut part = [0u8; 12];
    buf.get(199, &mut part).expect("get");
    assert_eq!(part[0], data[99]);
    assert_eq!(&part[1..11], &[0xAB; 10]);
    assert_eq!(part[11], data[110]);
    // Out of the buffer: refused here, before anything is sent.
    assert!(buf.get(4000, &mut back).is_err());

    child.kill().expect("kill the server");
    child.wait().expect("reap the server");
    let err = buf.get(0, &mut back).err().map(message).unwrap_or_default();
    assert!(err.contains("connection lost"), "{err}");
    let err = buf.set(0, &data).err().map(message).unwrap_or_default();
    assert!(err.contains("connection lost"), "{err}");
}
