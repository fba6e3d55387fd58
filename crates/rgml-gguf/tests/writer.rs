//! Writer round trips, layout, and the typed metadata getters.

use rgml::DType;
use rgml_gguf::{GgufError, GgufFile, GgufWriter, Value};

fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(255)),
        ("i8", Value::I8(-128)),
        ("u16", Value::U16(65535)),
        ("i16", Value::I16(-32768)),
        ("u32", Value::U32(u32::MAX)),
        ("i32", Value::I32(i32::MIN)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f32", Value::F32(-0.0)),
        ("f64", Value::F64(1e300)),
        ("bool", Value::Bool(false)),
        ("str", Value::String("héllo\0world".into())),
        ("empty_str", Value::String(String::new())),
        // Empty arrays keep their declared element type (u8, string).
        ("empty_arr", Value::EmptyArray(0)),
        ("empty_strs", Value::EmptyArray(8)),
        (
            "bools",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        (
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::Array(vec![Value::U16(1)])]),
                Value::Array(vec![Value::EmptyArray(4)]),
            ]),
        ),
    ]
}

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add_metadata(k, v);
    }
    let q4k = vec![3u8; DType::Q4_K.row_bytes(256).unwrap() * 3];
    w.add_tensor("a", DType::Q4_K, &[256, 3], &q4k).unwrap();
    w.add_tensor("b", DType::F16, &[3, 1, 2], &[9u8; 12])
        .unwrap();
    w.add_tensor("c", DType::I32, &[1], &[1, 2, 3, 4]).unwrap();
    w
}

#[test]
fn values_and_tensors_round_trip_exactly() {
    let bytes = sample_writer().to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    let want: Vec<(String, Value)> = all_values()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(f.metadata(), &want[..]);
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let b = f.tensor("b").unwrap();
    assert_eq!(
        (b.dtype, b.ne, b.n_dims, b.size),
        (DType::F16, [3, 1, 2, 1], 3, 12)
    );
    assert_eq!(f.tensor_data(b), &[9u8; 12]);
    assert_eq!(f.tensor_data(f.tensor("c").unwrap()), &[1, 2, 3, 4]);
    assert_eq!(f.data_offset() % 32, 0);
    for t in f.tensors() {
        assert_eq!(t.offset % 32, 0);
    }
    // Reading and writing again gives the same bytes.
    let again = GgufWriter::from_file(&f).unwrap().to_bytes().unwrap();
    assert!(again == bytes);
    // And writing the same content twice is deterministic.
    assert!(sample_writer().to_bytes().unwrap() == bytes);
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample_writer();
    w.add_metadata("general.alignment", Value::U32(256));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 256);
    assert_eq!(f.data_offset() % 256, 0);
    assert!(f.tensors().iter().all(|t| t.offset % 256 == 0));
    assert_eq!(f.tensors()[1].offset, 512); // 3 * 144 = 432 bytes of Q4_K, rounded up to 256

    w.add_metadata("general.alignment", Value::U32(48));
    assert!(matches!(w.to_bytes(), Err(GgufError::BadAlignment { .. })));
}

#[test]
fn writer_rejects_what_it_cannot_write() {
    let mut w = GgufWriter::new();
    w.add_tensor("t", DType::F32, &[2], &[0; 8]).unwrap();
    let kind = |r: rgml_gguf::Result<()>| r.unwrap_err().kind();
    assert_eq!(
        kind(w.add_tensor("t", DType::F32, &[2], &[0; 8])),
        "duplicate_tensor"
    );
    assert_eq!(
        kind(w.add_tensor("u", DType::F32, &[], &[])),
        "invalid_tensor"
    );
    assert_eq!(
        kind(w.add_tensor("u", DType::F32, &[1; 5], &[0; 4])),
        "invalid_tensor"
    );
    assert_eq!(
        kind(w.add_tensor("u", DType::F32, &[2, 0], &[])),
        "invalid_tensor"
    );
    assert_eq!(
        kind(w.add_tensor("u", DType::F32, &[3], &[0; 8])),
        "invalid_tensor"
    );
    assert_eq!(
        kind(w.add_tensor("u", DType::Q8_0, &[16], &[0; 17])),
        "block_misaligned"
    );
    assert_eq!(
        kind(w.add_tensor("u", DType::F32, &[usize::MAX, 2], &[])),
        "invalid_tensor"
    );

    w.add_metadata("m", Value::Array(vec![Value::U8(1), Value::I8(1)]));
    assert_eq!(w.to_bytes().unwrap_err().kind(), "mixed_array");
    let mut deep = Value::U8(0);
    for _ in 0..9 {
        deep = Value::Array(vec![deep]);
    }
    w.add_metadata("m", deep);
    assert_eq!(w.to_bytes().unwrap_err().kind(), "nesting_too_deep");
    w.add_metadata("m", Value::EmptyArray(13));
    assert_eq!(w.to_bytes().unwrap_err().kind(), "unknown_value_type");
    // Setting a key again replaces its value in place.
    w.add_metadata("m", Value::U8(1));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.metadata().len(), 1);
    assert_eq!(f.get("m"), Some(&Value::U8(1)));
}

/// Copying a file with many keys and tensors is linear (the writer's duplicate checks are
/// hashed; they were linear scans, so the fuzzer's 64 KiB inputs with 4,000 keys took 0.7 s
/// each), and a key set again keeps its first position.
#[test]
fn many_keys_and_tensors_copy_in_order() {
    let mut w = GgufWriter::new();
    for i in 0..30_000u32 {
        w.add_metadata(format!("k{i}"), Value::U32(i));
    }
    for i in 0..4_000 {
        w.add_tensor(&format!("t{i}"), DType::F32, &[1], &[0; 4])
            .unwrap();
    }
    w.add_metadata("k7", Value::String("again".into()));
    assert_eq!(
        w.add_tensor("t3999", DType::F32, &[1], &[0; 4])
            .unwrap_err()
            .kind(),
        "duplicate_tensor"
    );
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.metadata().len(), 30_000);
    assert_eq!(
        f.metadata()[7],
        ("k7".into(), Value::String("again".into()))
    );
    assert_eq!(f.tensors()[3999].name, "t3999");
    assert!(GgufWriter::from_file(&f).unwrap().to_bytes().unwrap() == bytes);
}

#[test]
fn typed_getters_explain_failures() {
    let f = GgufFile::from_bytes(sample_writer().to_bytes().unwrap()).unwrap();
    assert_eq!(f.get_u64("u8").unwrap(), 255);
    assert_eq!(f.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(f.get_f32("f64").unwrap(), f32::INFINITY);
    assert_eq!(f.get_str("str").unwrap(), "héllo\0world");
    assert_eq!(f.get_array("bools").unwrap().len(), 2);

    let e = f.get_u64("i8").unwrap_err();
    assert_eq!(e.kind(), "wrong_type");
    assert!(
        e.to_string().contains("'i8'") && e.to_string().contains("-128"),
        "{e}"
    );
    let e = f.get_str("u32").unwrap_err();
    assert!(e.to_string().contains("expected string, found u32"), "{e}");
    let e = f.get_f32("missing").unwrap_err();
    assert_eq!(e.kind(), "missing_key");
    assert!(e.to_string().contains("'missing'"));
    assert_eq!(f.get_array("str").unwrap_err().kind(), "wrong_type");
    assert!(f.get("nope").is_none() && f.tensor("nope").is_none());
}

#[test]
fn foreign_tensor_info_gives_empty_data() {
    let f = GgufFile::from_bytes(sample_writer().to_bytes().unwrap()).unwrap();
    let mut t = f.tensors()[0].clone();
    t.offset = usize::MAX - 1;
    assert!(f.tensor_data(&t).is_empty());
}

#[test]
fn open_maps_files_and_reports_io_errors() {
    let dir = std::env::temp_dir().join(format!("rgml-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.gguf");
    sample_writer().write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.memory().bytes(), &std::fs::read(&path).unwrap()[..]);

    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(GgufFile::open(&empty).unwrap_err().kind(), "truncated");
    let e = GgufFile::open(dir.join("absent.gguf")).unwrap_err();
    assert_eq!(e.kind(), "io");
    assert!(e.to_string().contains("absent.gguf"));
    let e = sample_writer()
        .write_file(dir.join("no/such/dir/x.gguf"))
        .unwrap_err();
    assert_eq!(e.kind(), "io");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Offset of the first tensor's ggml type id in a file with no metadata: header (magic, version,
/// tensor count, kv count), then the tensor's name (u64 length + bytes), n_dims and its dims.
fn first_type_id(bytes: &[u8], name_len: usize, n_dims: usize) -> u32 {
    let at = 4 + 4 + 8 + 8 + 8 + name_len + 4 + 8 * n_dims;
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[test]
fn low_bit_iq4_and_mxfp4_tensors_round_trip_with_ggml_type_ids() {
    // Real quantized rows (not filler bytes): the data must come back bit for bit and decode
    // to what it decoded to before writing.
    let x: Vec<f32> = (0..512)
        .map(|i| (i as f32 * 0.37).sin() * 2.0 + 0.1)
        .collect();
    for (dtype, id) in [
        (DType::Q2_K, 10),
        (DType::Q3_K, 11),
        (DType::IQ4_NL, 20),
        (DType::IQ4_XS, 23),
        (DType::MXFP4, 39),
    ] {
        let mut q = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
        rgml::quant::quantize_row(dtype, &x, &mut q).unwrap();
        let mut w = GgufWriter::new();
        w.add_tensor("w", dtype, &[256, 2], &q).unwrap();
        let bytes = w.to_bytes().unwrap();
        assert_eq!(first_type_id(&bytes, 1, 2), id, "{dtype}");
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        let t = f.tensor("w").unwrap();
        assert_eq!((t.dtype, t.ne, t.size), (dtype, [256, 2, 1, 1], q.len()));
        assert_eq!(f.tensor_data(t), &q[..], "{dtype}");
        let (mut before, mut after) = (vec![0.0f32; 512], vec![0.0f32; 512]);
        rgml::quant::dequantize_row(dtype, &q, &mut before).unwrap();
        rgml::quant::dequantize_row(dtype, f.tensor_data(t), &mut after).unwrap();
        assert_eq!(before, after, "{dtype}");
        let again = GgufWriter::from_file(&f).unwrap().to_bytes().unwrap();
        assert!(again == bytes, "{dtype}");
        // A row that is not whole blocks of the type is refused.
        assert!(GgufWriter::new()
            .add_tensor("bad", dtype, &[dtype.block_size() / 2, 1], &q)
            .is_err());
    }
}

/// Streaming the same tensors in pieces gives the same bytes as writing them from memory, and
/// the file reads back.
#[test]
fn streamed_tensors_match_buffered_ones() {
    use rgml_gguf::TensorDecl;
    let a: Vec<u8> = (0..=255).cycle().take(18 * 3).collect(); // 3 Q4_0 blocks
    let b: Vec<u8> = (0..12).collect(); // 3 f32
    let mut buffered = GgufWriter::new();
    buffered.add_metadata("general.architecture", Value::String("llama".into()));
    let mut header = GgufWriter::new();
    header.add_metadata("general.architecture", Value::String("llama".into()));
    buffered.add_tensor("a", DType::Q4_0, &[32, 3], &a).unwrap();
    buffered.add_tensor("b", DType::F32, &[3], &b).unwrap();
    let decls = [
        TensorDecl {
            name: "a".into(),
            dtype: DType::Q4_0,
            ne: vec![32, 3],
        },
        TensorDecl {
            name: "b".into(),
            dtype: DType::F32,
            ne: vec![3],
        },
    ];
    let mut s = header.stream_to(Vec::new(), &decls).unwrap();
    assert_eq!(s.current_tensor(), Some("a"));
    s.write_data(&a[..18]).unwrap();
    s.write_data(&a[18..]).unwrap();
    assert_eq!(s.current_tensor(), Some("b"));
    s.write_data(&b).unwrap();
    assert_eq!(s.current_tensor(), None);
    let bytes = s.finish().unwrap();
    assert_eq!(bytes, buffered.to_bytes().unwrap());
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.tensor_data(f.tensor("a").unwrap()), &a[..]);
}

#[test]
fn stream_rejects_wrong_amounts_of_data() {
    use rgml_gguf::TensorDecl;
    let decls = [TensorDecl {
        name: "t".into(),
        dtype: DType::F32,
        ne: vec![2],
    }];
    let w = GgufWriter::new();
    let mut s = w.stream_to(Vec::new(), &decls).unwrap();
    assert!(matches!(
        s.write_data(&[0; 12]),
        Err(GgufError::InvalidTensor { ref tensor, .. }) if tensor == "t"
    ));
    s.write_data(&[0; 4]).unwrap();
    let err = s.finish().unwrap_err().to_string();
    assert!(err.contains("only 4 of its 8 bytes"), "{err}");
    // A misaligned shape and a duplicate name are refused before anything is written.
    let bad = [TensorDecl {
        name: "q".into(),
        dtype: DType::Q4_0,
        ne: vec![33],
    }];
    assert!(matches!(
        w.stream_to(Vec::new(), &bad),
        Err(GgufError::BlockMisaligned { .. })
    ));
    let dup = [decls[0].clone(), decls[0].clone()];
    assert!(matches!(
        w.stream_to(Vec::new(), &dup),
        Err(GgufError::DuplicateTensor { .. })
    ));
}
