//! Fuzz the GGUF reader: any input must give `Ok` or `Err`, never a panic, and what parses must
//! be self-consistent and re-writable.
//!
//! Run (from crates/rgml-gguf/fuzz, seeded with the hostile corpus):
//! `RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_reader corpus ../tests/corpus -- -max_total_time=60`
#![no_main]

use libfuzzer_sys::fuzz_target;
use rgml_gguf::{GgufFile, GgufWriter};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (k, v) in f.metadata() {
        assert!(f.get(k).is_some());
        let _ = v.to_string();
        let _ = (v.as_u64(), v.as_i64(), v.as_f32(), v.as_bool(), v.as_str(), v.as_array());
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
    // What parses, the writer writes (skipped for huge alignments, whose padding alone would be
    // gigabytes), and the result parses to the same content (metadata is
    // compared through its encoding, so NaNs compare equal).
    if f.alignment() > 1 << 16 {
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
