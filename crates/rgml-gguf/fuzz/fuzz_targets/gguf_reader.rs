//! Fuzz the GGUF reader: any input must give `Ok` or `Err`, never a panic, and what parses must
//! be self-consistent and re-writable.
//!
//! Inputs go up to 64 KiB (`-max_len=65536`; libFuzzer's default would be 4 KiB, too short for a
//! real header's tokenizer arrays or tensor-info section), seeded with real headers and the
//! hostile corpus. `scripts/fuzz-gguf.sh` builds the seeds and runs it; by hand, from
//! crates/rgml-gguf/fuzz:
//! `cargo +nightly fuzz run -s none gguf_reader corpus SEEDS ../tests/corpus -- -max_len=65536`
//! (on stable: `RUSTC_BOOTSTRAP=1 cargo fuzz run ...`). cargo-fuzz reads no per-target options
//! file, so the flag must be given; without it libFuzzer takes the largest seed's size, which is
//! 64 KiB when the seeds include the script's `real-head.bin`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rgml_gguf::{GgufFile, GgufWriter, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (k, v) in f.metadata() {
        assert!(f.get(k).is_some());
        let _ = v.to_string();
        let _ = (
            v.as_u64(),
            v.as_i64(),
            v.as_f32(),
            v.as_bool(),
            v.as_str(),
            v.as_array(),
        );
        let _ = (f.get_u64(k), f.get_f32(k), f.get_str(k), f.get_array(k));
    }
    let mut checksum = 0u8;
    for t in f.tensors() {
        assert_eq!(f.tensor(&t.name), Some(t));
        let bytes = f.tensor_data(t);
        assert_eq!(bytes.len(), t.size);
        checksum ^= bytes.iter().fold(0, |a, b| a ^ b);
    }
    std::hint::black_box(checksum);
    // What parses, the writer writes, and the result parses to the same content (metadata is
    // compared through its encoding, so NaNs compare equal). Skipped for huge alignments, whose
    // padding alone would be gigabytes, and for files of very many metadata values.
    if f.alignment() > 1 << 16 || metadata_values(f.metadata()) > MAX_ROUND_TRIP_VALUES {
        return;
    }
    if let Ok(w) = GgufWriter::from_file(&f) {
        let bytes = w.to_bytes().expect("a parsed file is writable");
        let g = GgufFile::from_bytes(bytes.clone()).expect("written file parses");
        assert_eq!(f.tensors().len(), g.tensors().len());
        assert_eq!(f.metadata().len(), g.metadata().len());
        let again = GgufWriter::from_file(&g).unwrap().to_bytes().unwrap();
        assert!(again == bytes, "writer is not a fixed point");
    }
});

/// Files holding more metadata values than this (array elements included) skip the writer round
/// trip; parsing them still runs. The seeds made from real headers hold up to about 6,000 and
/// keep it; 64 KiB of one-byte array elements (65,000 values) would spend 17 ms an execution on
/// copying, writing and parsing them again.
const MAX_ROUND_TRIP_VALUES: usize = 1 << 14;

fn metadata_values(kvs: &[(String, Value)]) -> usize {
    fn count(v: &Value) -> usize {
        1 + v.as_array().map_or(0, |a| a.iter().map(count).sum())
    }
    kvs.iter().map(|(_, v)| count(v)).sum()
}
