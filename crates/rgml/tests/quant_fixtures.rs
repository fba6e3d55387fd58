//! Bit-exactness against gguf-py (ggml's Python port of the GGUF codecs) and ggml's C reference.
//!
//! The fixtures come from `scripts/gen_quant_fixtures.py` (its docstring describes the format)
//! and, for ggml's C reference quantizers, `scripts/ggml_ref/gen.sh`.

use rgml::quant::{dequantize_row, quantize_row};
use rgml::DType;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn read(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

struct Fixture {
    dtype: DType,
    n: usize,
    quantized_by_gguf: bool,
}

fn manifest() -> Vec<Fixture> {
    let text = String::from_utf8(read("manifest.txt")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "bad manifest line {l:?}");
            Fixture {
                dtype: DType::from_name(f[0]).unwrap(),
                n: f[1].parse().unwrap(),
                quantized_by_gguf: match f[2] {
                    "quant" => true,
                    "dequant" => false,
                    other => panic!("bad mode {other:?}"),
                },
            }
        })
        .collect()
}

fn first_diff<'a, T: PartialEq>(a: &'a [T], b: &'a [T]) -> Option<(usize, &'a T, &'a T)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| (i, x, y))
}

#[test]
fn manifest_covers_the_expected_types() {
    let m = manifest();
    let has = |t: DType, q: bool| m.iter().any(|f| f.dtype == t && f.quantized_by_gguf == q);
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::F16,
        DType::BF16,
    ] {
        assert!(has(t, true), "{t}: no quantize fixture");
    }
    for t in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        assert!(has(t, false), "{t}: no dequantize fixture");
    }
}

#[test]
fn dequantize_is_bit_identical_to_gguf() {
    for f in manifest() {
        let name = f.dtype.name();
        let bytes = read(&format!("{name}.bin"));
        let expect = read_f32(&format!("{name}.out.f32"));
        assert_eq!(bytes.len(), f.dtype.row_bytes(f.n).unwrap(), "{name}");
        assert_eq!(expect.len(), f.n, "{name}");
        let mut got = vec![0.0f32; f.n];
        dequantize_row(f.dtype, &bytes, &mut got).unwrap();
        let got_bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        let expect_bits: Vec<u32> = expect.iter().map(|v| v.to_bits()).collect();
        if let Some((i, g, e)) = first_diff(&got_bits, &expect_bits) {
            panic!(
                "{name}: element {i}: got {} ({g:#010x}), gguf {} ({e:#010x})",
                f32::from_bits(*g),
                f32::from_bits(*e)
            );
        }
        // Unaligned source bytes decode the same.
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        let mut got2 = vec![0.0f32; f.n];
        dequantize_row(f.dtype, &shifted[1..], &mut got2).unwrap();
        assert!(
            got.iter()
                .zip(&got2)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}"
        );
    }
}

#[test]
fn quantize_is_bit_identical_to_gguf() {
    for f in manifest().into_iter().filter(|f| f.quantized_by_gguf) {
        let name = f.dtype.name();
        let input = read_f32(&format!("{name}.in.f32"));
        let expect = read(&format!("{name}.bin"));
        assert_eq!(input.len(), f.n, "{name}");
        let mut got = vec![0u8; f.dtype.row_bytes(f.n).unwrap()];
        quantize_row(f.dtype, &input, &mut got).unwrap();
        if let Some((i, g, e)) = first_diff(&got, &expect) {
            let bb = f.dtype.block_bytes();
            panic!(
                "{name}: byte {i} (block {}, offset {}): got {g:#04x}, gguf {e:#04x}",
                i / bb,
                i % bb
            );
        }
    }
}

/// ggml's own C reference quantizers (`quantize_row_*_ref`), for every quantized type including
/// those gguf-py cannot quantize (Q8_1 and the k-quants). Made by `scripts/ggml_ref/gen.sh`.
#[test]
fn quantize_is_bit_identical_to_ggml_c_reference() {
    let input = read_f32("ggml_ref/input.f32");
    assert_eq!(input.len() % 256, 0);
    for dtype in DType::ALL.into_iter().filter(|t| t.is_quantized()) {
        let name = dtype.name();
        let expect = read(&format!("ggml_ref/{name}.bin"));
        let mut got = vec![0u8; dtype.row_bytes(input.len()).unwrap()];
        quantize_row(dtype, &input, &mut got).unwrap();
        assert_eq!(got.len(), expect.len(), "{name}");
        if let Some((i, g, e)) = first_diff(&got, &expect) {
            let bb = dtype.block_bytes();
            panic!(
                "{name}: byte {i} (block {}, offset {}): got {g:#04x}, ggml {e:#04x}",
                i / bb,
                i % bb
            );
        }
    }
}
