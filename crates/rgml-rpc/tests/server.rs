//! The server against hostile clients: truncated, oversized and out-of-bounds messages of every
//! command, graphs with cycles, dangling or duplicate ids, lying shapes and views out of their
//! source. Each must close that connection (never crash, never touch bytes outside a buffer)
//! and the server must then serve the next client correctly. A well-formed client computes a
//! graph through the raw protocol and reads the right answer.

mod common {
    pub mod seeds;
}

use rgml::DType;
use rgml_rpc::ggml::{flag, op};
use rgml_rpc::server::{serve, ServerOptions};
use rgml_rpc::wire::{
    read_response, set_tensor_header, write_request, Command, Request, RpcTensor, WireGraph,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

/// Bytes of buffers each client may hold.
const CLIENT_MEMORY: usize = 1 << 20;

/// One server for the whole test binary, on the CPU device.
fn server() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        rgml_cpu::register();
        let cpu = rgml::registry::device("CPU").expect("CPU device");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = listener.local_addr().expect("address").to_string();
        let options = ServerOptions {
            devices: vec![cpu],
            threads: Some(1),
            client_memory: CLIENT_MEMORY,
            max_clients: 64,
            cache_dir: None,
        };
        std::thread::spawn(move || serve(listener, options));
        endpoint
    })
}

struct Client {
    s: TcpStream,
}

impl Client {
    /// Connected, before HELLO.
    fn raw() -> Client {
        let s = TcpStream::connect(server()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Client { s }
    }

    /// Connected, after HELLO.
    fn new() -> Client {
        let mut c = Client::raw();
        let hello = c.call(&Request::Hello { caps: [0; 24] }, 28);
        assert_eq!(&hello[..3], &[7, 0, 0]);
        c
    }

    fn send(&mut self, command: Command, payload: &[u8]) {
        // The server may already have hung up: a failed write is then expected.
        let _ = write_request(&mut self.s, command, payload);
    }

    fn call(&mut self, req: &Request, n: usize) -> Vec<u8> {
        self.send(req.command(), &req.encode());
        let r = read_response(&mut self.s, 1 << 30).expect("a reply");
        assert_eq!(r.len(), n, "reply to {:?}", req.command());
        r
    }

    /// A buffer of `size` bytes: its id and base address.
    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let r = self.call(&Request::AllocBuffer { device: 0, size }, 16);
        let id = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        assert_ne!(id, 0, "allocation of {size} bytes refused");
        let r = self.call(&Request::BufferGetBase { buffer: id }, 8);
        (id, u64::from_le_bytes(r[..8].try_into().expect("8 bytes")))
    }

    /// Whether the server has closed the connection (a read gives end of file or a reset).
    fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn f32_tensor(id: u64, buffer: u64, data: u64, ne: [u32; 4]) -> RpcTensor {
    let nb0 = 4u32;
    RpcTensor {
        id,
        dtype: 0,
        buffer,
        ne,
        nb: [
            nb0,
            nb0 * ne[0],
            nb0 * ne[0] * ne[1],
            nb0 * ne[0] * ne[1] * ne[2],
        ],
        data,
        ..RpcTensor::default()
    }
}

/// After something hostile: the connection is closed, and a new client is served.
fn closes_and_serves_the_next(mut hostile: Client, what: &str) {
    assert!(hostile.is_closed(), "{what}: the connection stayed open");
    let mut c = Client::new();
    let (id, base) = c.alloc(256);
    let t = f32_tensor(1, id, base, [64, 1, 1, 1]);
    let data: Vec<u8> = (0..256u32).map(|i| (i * 13 + 1) as u8).collect();
    c.send(
        Command::SetTensor,
        &[set_tensor_header(&t, 0, 0), data.clone()].concat(),
    );
    let back = c.call(
        &Request::GetTensor {
            tensor: Box::new(t),
            offset: 0,
            size: 256,
        },
        256,
    );
    assert_eq!(back, data, "{what}: the next client's bytes");
}

#[test]
fn a_graph_computes_through_the_raw_protocol() {
    let mut c = Client::new();
    let (id, base) = c.alloc(3 * 4 * 8);
    let a = f32_tensor(1, id, base, [8, 1, 1, 1]);
    let b = f32_tensor(2, id, base + 32, [8, 1, 1, 1]);
    let mut sum = f32_tensor(3, id, base + 64, [8, 1, 1, 1]);
    sum.op = op::ADD;
    sum.src[0] = 1;
    sum.src[1] = 2;
    sum.flags = flag::OUTPUT | flag::COMPUTE;
    let xs: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 1.25).collect();
    let ys: Vec<f32> = (0..8).map(|i| 3.0 - i as f32 * 0.75).collect();
    for (t, v) in [(&a, &xs), (&b, &ys)] {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        c.send(
            Command::SetTensor,
            &[set_tensor_header(t, 0, 0), bytes].concat(),
        );
    }
    let graph = WireGraph {
        device: 0,
        nodes: vec![3],
        tensors: vec![a, b, sum.clone()],
    };
    let mut payload = Vec::new();
    graph.encode(&mut payload);
    for round in 0..2 {
        if round == 0 {
            c.send(Command::GraphCompute, &payload);
        } else {
            c.send(Command::GraphRecompute, &0u32.to_le_bytes());
        }
        let out = c.call(
            &Request::GetTensor {
                tensor: Box::new(sum.clone()),
                offset: 0,
                size: 32,
            },
            32,
        );
        for (i, chunk) in out.chunks(4).enumerate() {
            let got = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
            assert_eq!(got, xs[i] + ys[i], "element {i}, round {round}");
        }
    }
}

#[test]
fn requests_before_hello_unknown_commands_and_huge_frames_close_the_connection() {
    let mut c = Client::raw();
    c.send(Command::DeviceCount, &[]);
    closes_and_serves_the_next(c, "DEVICE_COUNT before HELLO");

    let mut c = Client::new();
    let _ = c.s.write_all(&[200, 0, 0, 0, 0, 0, 0, 0, 0]);
    closes_and_serves_the_next(c, "command 200");

    let mut c = Client::new();
    // SET_TENSOR announcing 1 TiB: refused by its size, before anything is read or allocated.
    let _ = c.s.write_all(&[Command::SetTensor as u8]);
    let _ = c.s.write_all(&(1u64 << 40).to_le_bytes());
    closes_and_serves_the_next(c, "a 1 TiB frame");

    let mut c = Client::new();
    c.send(Command::Hello, &[0; 24]);
    closes_and_serves_the_next(c, "a second HELLO");
}

#[test]
fn truncated_and_oversized_payloads_of_every_command_close_the_connection() {
    let t = f32_tensor(1, 1, 1 << 40, [4, 1, 1, 1]);
    let requests = [
        Request::DeviceCount,
        Request::AllocBuffer {
            device: 0,
            size: 64,
        },
        Request::GetAlignment { device: 0 },
        Request::GetMaxSize { device: 0 },
        Request::GetDeviceMemory { device: 0 },
        Request::BufferGetBase { buffer: 1 },
        Request::FreeBuffer { buffer: 1 },
        Request::BufferClear {
            buffer: 1,
            value: 0,
        },
        Request::SetTensorHash {
            tensor: Box::new(t.clone()),
            offset: 0,
            hash: 0,
        },
        Request::GetTensor {
            tensor: Box::new(t.clone()),
            offset: 0,
            size: 4,
        },
        Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t.clone()),
        },
        Request::MemsetTensor {
            tensor: Box::new(t.clone()),
            offset: 0,
            size: 4,
            value: 1,
        },
        Request::InitTensor {
            tensor: Box::new(t.clone()),
        },
        Request::GetAllocSize {
            device: 0,
            tensor: Box::new(t.clone()),
            srcs: Vec::new(),
        },
        Request::GraphRecompute { device: 0 },
    ];
    for req in &requests {
        let full = req.encode();
        if !full.is_empty() {
            let mut c = Client::new();
            c.send(req.command(), &full[..full.len() - 1]);
            closes_and_serves_the_next(c, &format!("{:?} one byte short", req.command()));
        }
        let mut c = Client::new();
        c.send(req.command(), &[full.as_slice(), &[0]].concat());
        closes_and_serves_the_next(c, &format!("{:?} one byte long", req.command()));
    }
    // SET_TENSOR's and GRAPH_COMPUTE's payloads are variable: shorter than their headers.
    for command in [Command::SetTensor, Command::GraphCompute] {
        let mut c = Client::new();
        c.send(command, &[1, 2, 3]);
        closes_and_serves_the_next(c, &format!("{command:?} of 3 bytes"));
    }
}

#[test]
fn out_of_bounds_ranges_unknown_buffers_and_devices_close_the_connection() {
    type Hostile = fn(&mut Client, u64, u64) -> Option<usize>;
    let cases: Vec<(&str, Hostile)> = vec![
        ("SET_TENSOR past the buffer's end", |c, id, base| {
            let t = f32_tensor(1, id, base + 64, [64, 1, 1, 1]);
            c.send(
                Command::SetTensor,
                &[set_tensor_header(&t, 0, 0), vec![7; 256]].concat(),
            );
            None
        }),
        ("SET_TENSOR before the buffer", |c, id, base| {
            let t = f32_tensor(1, id, base - 4, [4, 1, 1, 1]);
            c.send(
                Command::SetTensor,
                &[set_tensor_header(&t, 0, 0), vec![7; 16]].concat(),
            );
            None
        }),
        ("SET_TENSOR past its tensor", |c, id, base| {
            let t = f32_tensor(1, id, base, [4, 1, 1, 1]);
            c.send(
                Command::SetTensor,
                &[set_tensor_header(&t, 0, 8), vec![7; 16]].concat(),
            );
            None
        }),
        ("GET_TENSOR with an offset that wraps", |c, id, base| {
            let t = f32_tensor(1, id, base, [4, 1, 1, 1]);
            let req = Request::GetTensor {
                tensor: Box::new(t),
                offset: u64::MAX - 3,
                size: 8,
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("GET_TENSOR of a huge stride", |c, id, base| {
            let mut t = f32_tensor(1, id, base, [4, 2, 1, 1]);
            t.nb[1] = u32::MAX;
            let req = Request::GetTensor {
                tensor: Box::new(t),
                offset: 0,
                size: 4,
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("MEMSET_TENSOR past the buffer", |c, id, base| {
            let t = f32_tensor(1, id, base + 200, [64, 1, 1, 1]);
            let req = Request::MemsetTensor {
                tensor: Box::new(t),
                offset: 0,
                size: 256,
                value: 9,
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("COPY_TENSOR into too small a place", |c, id, base| {
            let src = f32_tensor(1, id, base, [64, 1, 1, 1]);
            let dst = f32_tensor(2, id, base + 128, [4, 1, 1, 1]);
            let req = Request::CopyTensor {
                src: Box::new(src),
                dst: Box::new(dst),
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("a tensor in an unknown buffer", |c, id, base| {
            let t = f32_tensor(1, id + 77, base, [4, 1, 1, 1]);
            let req = Request::GetTensor {
                tensor: Box::new(t),
                offset: 0,
                size: 4,
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("an unknown ggml type", |c, id, base| {
            let mut t = f32_tensor(1, id, base, [4, 1, 1, 1]);
            t.dtype = 99;
            let req = Request::InitTensor {
                tensor: Box::new(t),
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("FREE_BUFFER of an unknown buffer", |c, id, _| {
            let req = Request::FreeBuffer { buffer: id + 5 };
            c.send(req.command(), &req.encode());
            None
        }),
        ("BUFFER_CLEAR of a freed buffer", |c, id, _| {
            let req = Request::FreeBuffer { buffer: id };
            c.send(req.command(), &req.encode());
            let req = Request::BufferClear {
                buffer: id,
                value: 1,
            };
            c.send(req.command(), &req.encode());
            None
        }),
        ("a device that does not exist", |c, _, _| {
            let req = Request::GetAlignment { device: 3 };
            c.send(req.command(), &req.encode());
            None
        }),
        ("GRAPH_RECOMPUTE without a graph", |c, _, _| {
            c.send(Command::GraphRecompute, &0u32.to_le_bytes());
            None
        }),
    ];
    for (what, hostile) in cases {
        let mut c = Client::new();
        let (id, base) = c.alloc(256);
        hostile(&mut c, id, base);
        closes_and_serves_the_next(c, what);
    }
}

#[test]
fn allocations_past_the_memory_cap_are_refused_and_the_connection_survives() {
    let mut c = Client::new();
    let (id, _) = c.alloc(CLIENT_MEMORY as u64 / 2);
    let r = c.call(
        &Request::AllocBuffer {
            device: 0,
            size: CLIENT_MEMORY as u64,
        },
        16,
    );
    assert_eq!(&r[..8], &[0; 8], "over the cap: a null buffer");
    let free = Request::FreeBuffer { buffer: id };
    c.send(free.command(), &free.encode());
    // Freed: the whole cap is available again.
    c.alloc(CLIENT_MEMORY as u64);
}

/// Graphs the server must refuse: each is `(what, tensors, nodes)` over one 1 KiB buffer.
fn hostile_graphs(id: u64, base: u64) -> Vec<(&'static str, Vec<RpcTensor>, Vec<u64>)> {
    let leaf = |tid: u64, at: u64| f32_tensor(tid, id, base + at, [8, 1, 1, 1]);
    let add = |tid: u64, a: u64, b: u64, at: u64| {
        let mut t = leaf(tid, at);
        t.op = op::ADD;
        t.src[0] = a;
        t.src[1] = b;
        t.flags = flag::COMPUTE;
        t
    };
    let mut wrong_shape = add(3, 1, 2, 64);
    wrong_shape.ne = [16, 1, 1, 1];
    wrong_shape.nb = [4, 64, 64, 64];
    let mut bad_op = add(3, 1, 2, 64);
    bad_op.op = 1000;
    let mut outside = add(3, 1, 2, 1020);
    outside.data = base + 1020;
    let mut view = leaf(3, 0);
    view.op = op::VIEW;
    view.src[0] = 1;
    view.view_src = 1;
    view.op_params[0] = 4096; // past its 32-byte source
    let mut lying_view = leaf(3, 8);
    lying_view.op = op::VIEW;
    lying_view.src[0] = 1;
    lying_view.view_src = 1;
    lying_view.op_params[0] = 4; // but the address says 8
    lying_view.ne = [4, 1, 1, 1];
    lying_view.nb = [4, 16, 16, 16];
    let mut permute = leaf(3, 0);
    permute.op = op::PERMUTE;
    permute.src[0] = 1;
    permute.view_src = 1;
    permute.op_params[..4].copy_from_slice(&[0, -1, 2, 3]);
    let mut extra_src = add(3, 1, 2, 64);
    extra_src.src[5] = 1;
    let mut bad_type = add(3, 1, 2, 64);
    bad_type.dtype = 24;
    vec![
        ("a cycle", vec![add(1, 2, 2, 0), add(2, 1, 1, 32)], vec![1]),
        ("a self loop", vec![add(1, 1, 1, 0)], vec![1]),
        (
            "a dangling source",
            vec![leaf(1, 0), add(3, 1, 9, 64)],
            vec![3],
        ),
        ("a node that is not sent", vec![leaf(1, 0)], vec![5]),
        (
            "duplicate ids",
            vec![leaf(1, 0), leaf(1, 32), add(3, 1, 1, 64)],
            vec![3],
        ),
        ("id 0", vec![leaf(0, 0), add(3, 1, 1, 64)], vec![3]),
        (
            "a lying shape",
            vec![leaf(1, 0), leaf(2, 32), wrong_shape],
            vec![3],
        ),
        (
            "an unknown op",
            vec![leaf(1, 0), leaf(2, 32), bad_op],
            vec![3],
        ),
        (
            "a node outside its buffer",
            vec![leaf(1, 0), leaf(2, 32), outside],
            vec![3],
        ),
        ("a view past its source", vec![leaf(1, 0), view], vec![3]),
        (
            "a view at the wrong address",
            vec![leaf(1, 0), lying_view],
            vec![3],
        ),
        (
            "a negative permute axis",
            vec![leaf(1, 0), permute],
            vec![3],
        ),
        (
            "a source the op does not read",
            vec![leaf(1, 0), leaf(2, 32), extra_src],
            vec![3],
        ),
        (
            "an integer result type",
            vec![leaf(1, 0), leaf(2, 32), bad_type],
            vec![3],
        ),
    ]
}

#[test]
fn hostile_graphs_close_the_connection() {
    for case in 0.. {
        let mut c = Client::new();
        let (id, base) = c.alloc(1024);
        let graphs = hostile_graphs(id, base);
        let Some((what, tensors, nodes)) = graphs.into_iter().nth(case) else {
            break;
        };
        let graph = WireGraph {
            device: 0,
            nodes,
            tensors,
        };
        let mut payload = Vec::new();
        graph.encode(&mut payload);
        c.send(Command::GraphCompute, &payload);
        closes_and_serves_the_next(c, what);
    }
    // A graph announcing 2^32 - 1 nodes in a few bytes.
    let mut c = Client::new();
    let mut payload = 0u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&u32::MAX.to_le_bytes());
    c.send(Command::GraphCompute, &payload);
    closes_and_serves_the_next(c, "2^32 - 1 nodes announced");
}

#[test]
fn the_device_count_and_types_are_ggmls() {
    let mut c = Client::new();
    let r = c.call(&Request::DeviceCount, 4);
    assert_eq!(r, 1u32.to_le_bytes());
    // A byte range as an I8 tensor (how clients move bytes) is accepted.
    let (id, base) = c.alloc(64);
    let bytes = RpcTensor {
        id: 1,
        dtype: 24,
        buffer: id,
        ne: [64, 1, 1, 1],
        nb: [1, 64, 64, 64],
        data: base,
        ..RpcTensor::default()
    };
    c.send(
        Command::SetTensor,
        &[set_tensor_header(&bytes, 0, 0), vec![5; 64]].concat(),
    );
    let r = c.call(
        &Request::GetTensor {
            tensor: Box::new(bytes),
            offset: 60,
            size: 4,
        },
        4,
    );
    assert_eq!(r, vec![5; 4]);
    assert_eq!(DType::from_ggml_id(0).ok(), Some(DType::F32));
}

/// The fuzz target's seeds (whole conversations over several op families) are served to the
/// end, each graph computed twice: a check of the ops' wire forms, and of the seeds.
#[test]
fn the_fuzz_seeds_are_served_to_the_end() {
    server();
    let cpu = rgml::registry::device("CPU").expect("CPU device");
    let options = ServerOptions {
        devices: vec![cpu],
        threads: Some(1),
        client_memory: CLIENT_MEMORY,
        max_clients: 1,
        cache_dir: None,
    };
    for (name, bytes) in common::seeds::seeds() {
        let mut replies = Vec::new();
        let served = rgml_rpc::server::serve_stream(bytes.as_slice(), &mut replies, &options);
        assert!(served.is_ok(), "{name}: {:?}", served.err());
        // HELLO (28), DEVICE_COUNT (4), ALLOC_BUFFER (16), BUFFER_GET_BASE (8), GET_TENSOR (16),
        // each with its 8-byte size.
        assert_eq!(replies.len(), 5 * 8 + 28 + 4 + 16 + 8 + 16, "{name}");
    }
}

/// Inputs the fuzz target once crashed on (`tests/corpus/`): each is served without a panic.
#[test]
fn the_fuzzers_former_crashes_are_served_without_panicking() {
    server();
    let cpu = rgml::registry::device("CPU").expect("CPU device");
    let options = ServerOptions {
        devices: vec![cpu],
        threads: Some(1),
        client_memory: 1 << 20,
        max_clients: 1,
        cache_dir: None,
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus directory") {
        let bytes = std::fs::read(entry.expect("an entry").path()).expect("a corpus file");
        let _ = rgml_rpc::server::serve_stream(bytes.as_slice(), std::io::sink(), &options);
        n += 1;
    }
    assert!(n > 0, "no corpus files in {}", dir.display());
}
