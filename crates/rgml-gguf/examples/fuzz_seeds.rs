//! Seeds for the GGUF fuzzer (`scripts/fuzz-gguf.sh`) made from a real model's header, each at
//! most 64 KiB (the fuzzer's `-max_len`):
//!
//! - `real-head.bin`: the model's first 64 KiB as they are (cut inside the tokenizer arrays);
//! - `real-shrunk-v3.bin`, `real-shrunk-v2.bin`: every key-value of the model with its arrays cut
//!   to their first elements, and every tensor info (real names, types and dimension counts) with
//!   its shape shrunk to one block, with data: a whole file that parses, as v3 and as v2;
//! - `real-metadata.bin`: the same key-values without tensors;
//! - `real-tensor-infos.bin`: the model's tensor-info section byte for byte (real shapes and
//!   offsets, which point past the end) under a header with no key-values.
//!
//! Usage: `cargo run --release -p rgml-gguf --example fuzz_seeds -- MODEL.gguf OUT_DIR`

use rgml_gguf::{GgufFile, GgufWriter, Value, DEFAULT_ALIGNMENT};
use std::path::Path;

const MAX_LEN: usize = 64 << 10;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, out] = args.as_slice() else {
        return Err("usage: fuzz_seeds MODEL.gguf OUT_DIR".into());
    };
    let out = Path::new(out);
    std::fs::create_dir_all(out)?;
    let write = |name: &str, bytes: &[u8]| -> Result<(), Error> {
        assert!(bytes.len() <= MAX_LEN, "{name}: {} bytes", bytes.len());
        std::fs::write(out.join(name), bytes)?;
        println!("{name}: {} bytes", bytes.len());
        Ok(())
    };
    let f = GgufFile::open(model)?;
    let raw = std::fs::read(model)?;

    write("real-head.bin", &raw[..raw.len().min(MAX_LEN)])?;

    // The largest array cut that fits, so the seed keeps as much of the tokenizer as it can.
    let shrunk = [1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
        .into_iter()
        .map(|keep| shrunk_file(&f, keep, true))
        .find(|b| b.as_ref().is_ok_and(|b| b.len() <= MAX_LEN))
        .ok_or("no shrunk file fits in 64 KiB")??;
    GgufFile::from_bytes(shrunk.clone())?;
    write("real-shrunk-v3.bin", &shrunk)?;
    let mut v2 = shrunk;
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    GgufFile::from_bytes(v2.clone())?;
    write("real-shrunk-v2.bin", &v2)?;

    let metadata = [4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8]
        .into_iter()
        .map(|keep| shrunk_file(&f, keep, false))
        .find(|b| b.as_ref().is_ok_and(|b| b.len() <= MAX_LEN))
        .ok_or("no metadata file fits in 64 KiB")??;
    write("real-metadata.bin", &metadata)?;

    // The tensor infos start where the key-values end and are followed by padding to the data.
    let start = 24
        + f.metadata()
            .iter()
            .map(|(k, v)| 8 + k.len() + 4 + encoded_len(v))
            .sum::<usize>();
    let end = start
        + f.tensors()
            .iter()
            .map(|t| 8 + t.name.len() + 4 + 8 * t.n_dims + 4 + 8)
            .sum::<usize>();
    assert_eq!(end.next_multiple_of(f.alignment()), f.data_offset());
    let mut infos = Vec::new();
    infos.extend_from_slice(b"GGUF");
    infos.extend_from_slice(&f.version().to_le_bytes());
    infos.extend_from_slice(&(f.tensors().len() as u64).to_le_bytes());
    infos.extend_from_slice(&0u64.to_le_bytes());
    infos.extend_from_slice(&raw[start..end]);
    infos.resize(infos.len().next_multiple_of(DEFAULT_ALIGNMENT), 0);
    write("real-tensor-infos.bin", &infos[..infos.len().min(MAX_LEN)])?;
    Ok(())
}

/// The model's key-values with arrays cut to `keep` elements and, if `tensors`, its tensors
/// shrunk to one block each (data: a byte pattern).
fn shrunk_file(f: &GgufFile, keep: usize, tensors: bool) -> Result<Vec<u8>, Error> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_metadata(k.clone(), cut(v, keep));
    }
    if tensors {
        for (i, t) in f.tensors().iter().enumerate() {
            let mut ne = vec![1; t.n_dims];
            ne[0] = t.dtype.block_size();
            let data: Vec<u8> = (0..t.dtype.block_bytes())
                .map(|j| (i * 31 + j * 7) as u8)
                .collect();
            w.add_tensor(&t.name, t.dtype, &ne, &data)?;
        }
    }
    Ok(w.to_bytes()?)
}

fn cut(v: &Value, keep: usize) -> Value {
    match v {
        Value::Array(items) => {
            Value::Array(items.iter().take(keep).map(|x| cut(x, keep)).collect())
        }
        other => other.clone(),
    }
}

/// Bytes `v` takes in a file (after its type id).
fn encoded_len(v: &Value) -> usize {
    match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(s) => 8 + s.len(),
        Value::Array(items) => 4 + 8 + items.iter().map(encoded_len).sum::<usize>(),
        Value::EmptyArray(_) => 4 + 8,
    }
}
