use super::*;

/// A tensor with every field distinct and non-zero.
fn sample() -> RpcTensor {
    let mut t = RpcTensor {
        id: 0x1122_3344_5566_7788,
        dtype: 8,
        buffer: 0xdead_beef,
        ne: [64, 3, 2, 1],
        nb: [4, 256, 768, 1536],
        op: 29,
        flags: 0x11,
        view_src: 77,
        view_offs: 128,
        data: 0x7000_0000,
        use_count: 5,
        ..RpcTensor::default()
    };
    for (i, p) in t.op_params.iter_mut().enumerate() {
        *p = i as i32 * 3 - 7;
    }
    for (i, s) in t.src.iter_mut().enumerate() {
        *s = 1000 + i as u64;
    }
    t.name[..6].copy_from_slice(b"Qcur-3");
    t
}

#[test]
fn the_packed_tensor_is_ggmls_size_and_layout() {
    // ggml's `rpc_tensor` under `#pragma pack(1)`: 296 bytes.
    assert_eq!(RPC_TENSOR_SIZE, 296);
    let t = sample();
    let mut bytes = Vec::new();
    t.encode(&mut bytes);
    assert_eq!(bytes.len(), RPC_TENSOR_SIZE);
    // Field offsets as in the C struct: id 0, type 8, buffer 12, ne 20, nb 36, op 52,
    // op_params 56, flags 120, src 124, view_src 204, view_offs 212, data 220, name 228,
    // use_count 292.
    assert_eq!(&bytes[8..12], &8u32.to_le_bytes());
    assert_eq!(&bytes[20..24], &64u32.to_le_bytes());
    assert_eq!(&bytes[52..56], &29u32.to_le_bytes());
    assert_eq!(&bytes[120..124], &0x11i32.to_le_bytes());
    assert_eq!(&bytes[124..132], &1000u64.to_le_bytes());
    assert_eq!(&bytes[220..228], &0x7000_0000u64.to_le_bytes());
    assert_eq!(&bytes[228..234], b"Qcur-3");
    assert_eq!(&bytes[292..296], &5i32.to_le_bytes());
    let back = RpcTensor::decode(&mut Reader::new(&bytes)).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.name(), "Qcur-3");
}

#[test]
fn commands_keep_ggmls_numbers() {
    assert_eq!(Command::Hello as u8, 14);
    assert_eq!(Command::MemsetTensor as u8, 17);
    for b in 0..18u8 {
        assert_eq!(Command::try_from(b).unwrap() as u8, b);
    }
    assert!(matches!(
        Command::try_from(18),
        Err(WireError::UnknownCommand(18))
    ));
}

#[test]
fn every_request_decodes_and_refuses_short_or_long_payloads() {
    let t = sample();
    let mut tb = Vec::new();
    t.encode(&mut tb);
    let le32 = |v: u32| v.to_le_bytes().to_vec();
    let le64 = |v: u64| v.to_le_bytes().to_vec();
    let cat = |parts: &[&[u8]]| parts.concat();
    let cases: Vec<(Command, Vec<u8>, Request)> = vec![
        (
            Command::Hello,
            vec![3; CONN_CAPS_SIZE],
            Request::Hello {
                caps: [3; CONN_CAPS_SIZE],
            },
        ),
        (
            Command::AllocBuffer,
            cat(&[&le32(1), &le64(4096)]),
            Request::AllocBuffer {
                device: 1,
                size: 4096,
            },
        ),
        (
            Command::BufferClear,
            cat(&[&le64(9), &[0xab]]),
            Request::BufferClear {
                buffer: 9,
                value: 0xab,
            },
        ),
        (
            Command::GetTensor,
            cat(&[&tb, &le64(16), &le64(32)]),
            Request::GetTensor {
                tensor: Box::new(t.clone()),
                offset: 16,
                size: 32,
            },
        ),
        (
            Command::CopyTensor,
            cat(&[&tb, &tb]),
            Request::CopyTensor {
                src: Box::new(t.clone()),
                dst: Box::new(t.clone()),
            },
        ),
        (
            Command::MemsetTensor,
            cat(&[&tb, &le64(1), &le64(2), &[7]]),
            Request::MemsetTensor {
                tensor: Box::new(t.clone()),
                offset: 1,
                size: 2,
                value: 7,
            },
        ),
        (
            Command::GraphRecompute,
            le32(2),
            Request::GraphRecompute { device: 2 },
        ),
    ];
    for (cmd, payload, want) in cases {
        assert_eq!(Request::decode(cmd, &payload).unwrap(), want, "{cmd:?}");
        let short = &payload[..payload.len() - 1];
        assert!(Request::decode(cmd, short).is_err(), "{cmd:?} short");
        let long = cat(&[&payload, &[0]]);
        assert!(Request::decode(cmd, &long).is_err(), "{cmd:?} long");
    }
    // SET_TENSOR takes the rest as data, even none.
    let payload = cat(&[&tb, &[1], &le64(8), b"abc"]);
    let Request::SetTensor { data, offset, .. } =
        Request::decode(Command::SetTensor, &payload).unwrap()
    else {
        panic!("not SET_TENSOR");
    };
    assert_eq!((data.as_slice(), offset), (&b"abc"[..], 8));
    assert!(Request::decode(Command::SetTensor, &tb).is_err());
}

#[test]
fn graph_counts_are_checked_before_allocation() {
    let t = sample();
    let mut payload = Vec::new();
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(&2u32.to_le_bytes());
    payload.extend_from_slice(&5u64.to_le_bytes());
    payload.extend_from_slice(&6u64.to_le_bytes());
    payload.extend_from_slice(&1u32.to_le_bytes());
    t.encode(&mut payload);
    let Request::GraphCompute(g) = Request::decode(Command::GraphCompute, &payload).unwrap() else {
        panic!("not a graph");
    };
    assert_eq!((g.nodes, g.tensors.len()), (vec![5, 6], 1));
    // A count of 4 billion nodes in a few bytes is refused, not allocated.
    let mut hostile = 0u32.to_le_bytes().to_vec();
    hostile.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Request::decode(Command::GraphCompute, &hostile),
        Err(WireError::BadLength { .. })
    ));
}

#[test]
fn frames_round_trip_and_oversized_ones_are_refused() {
    let mut wire = Vec::new();
    write_request(&mut wire, Command::DeviceCount, &[]).unwrap();
    write_request(&mut wire, Command::FreeBuffer, &9u64.to_le_bytes()).unwrap();
    let mut r = wire.as_slice();
    assert_eq!(
        read_request(&mut r, 1 << 20).unwrap(),
        (Command::DeviceCount, vec![])
    );
    let (cmd, payload) = read_request(&mut r, 1 << 20).unwrap();
    assert_eq!(
        Request::decode(cmd, &payload).unwrap(),
        Request::FreeBuffer { buffer: 9 }
    );
    // Announcing 1 TiB is refused before reading.
    let mut huge = vec![Command::SetTensor as u8];
    huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        read_request(&mut huge.as_slice(), 1 << 30),
        Err(WireError::TooLarge { .. })
    ));
    // A frame cut short is an error, not a hang or a short payload.
    let mut cut = Vec::new();
    write_response(&mut cut, b"0123456789").unwrap();
    cut.truncate(12);
    assert!(read_response(&mut cut.as_slice(), 1 << 20).is_err());
}
