//! Tests on the demo model, found where the README's fetch command puts it. Skipped (with a
//! note) when it is absent; CI always fetches it.

use rgml::DType;
use rgml_gguf::{GgufFile, GgufWriter, Value};
use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("note: {} absent, skipping", p.display());
        None
    }
}

#[test]
fn reads_the_demo_model() {
    let Some(path) = model_path() else { return };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert!(f.get_u64("llama.block_count").unwrap() > 0);
    assert!(f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() > 0.0);
    let tokens = f.get_array("tokenizer.ggml.tokens").unwrap();
    assert!(tokens.len() > 1000);
    assert!(tokens.iter().all(|t| t.as_str().is_some()));
    assert!(f.get_str("llama.block_count").is_err());
    assert!(f.get_u64("no.such.key").is_err());

    let dtypes: std::collections::HashSet<DType> = f.tensors().iter().map(|t| t.dtype).collect();
    assert!(dtypes.contains(&DType::F32));
    assert!(dtypes.contains(&DType::Q4_1) || dtypes.contains(&DType::Q8_0));
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    for t in f.tensors() {
        assert_eq!(f.tensor(&t.name), Some(t));
        let data = f.tensor_data(t);
        assert_eq!(data.len(), t.size);
        assert_eq!(t.offset % f.alignment(), 0);
        assert!(f.data_offset() + t.offset + t.size <= len);
        assert_eq!(
            t.size,
            t.dtype.row_bytes(t.ne[0]).unwrap() * t.ne[1] * t.ne[2] * t.ne[3]
        );
    }
    // The norm weights are f32 and finite.
    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.dtype, DType::F32);
    let bytes = f.tensor_data(norm);
    assert!(bytes
        .chunks_exact(4)
        .all(|c| f32::from_le_bytes(c.try_into().unwrap()).is_finite()));
    // The mapping is what the memory handle exposes.
    let mem = f.memory();
    let start = f.data_offset() + norm.offset;
    assert_eq!(&mem.bytes()[start..start + norm.size], bytes);
}

#[test]
fn demo_model_round_trips_through_the_writer() {
    let Some(path) = model_path() else { return };
    let f = GgufFile::open(&path).unwrap();
    let has_empty_array = f
        .metadata()
        .iter()
        .any(|(_, v)| matches!(v, Value::Array(a) if a.is_empty()));
    let bytes = GgufWriter::from_file(&f).unwrap().to_bytes().unwrap();
    let g = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.metadata(), g.metadata());
    assert_eq!(f.tensors(), g.tensors());
    assert_eq!(f.data_offset(), g.data_offset());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t), g.tensor_data(t), "{}", t.name);
    }
    // ggml's writer lays files out as ours does, so the copy is byte-identical (barring empty
    // arrays, whose element type a Value does not keep).
    if !has_empty_array {
        let original = std::fs::read(&path).unwrap();
        assert_eq!(original.len(), bytes.len());
        assert!(
            original == bytes,
            "round trip differs from the original file"
        );
    }
}
