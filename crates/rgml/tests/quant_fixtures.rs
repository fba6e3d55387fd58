//! Bit-exactness against gguf-py (ggml's Python port of the GGUF codecs) and ggml's C reference.
//!
//! The fixtures come from `scripts/gen_quant_fixtures.py` (its docstring describes the format)
//! and, for ggml's C quantizers as llama-quantize runs them (`quantize_<type>(..., NULL)`) and
//! its C dequantizers, `scripts/ggml_ref/gen.sh` (its header describes the format).

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

/// One line of `ggml_ref/manifest.txt` (written by `scripts/ggml_ref/ref_quant.c`).
struct GgmlRef {
    dtype: DType,
    /// `quantize_NULL` (ggml's `quantize_<type>(..., NULL)`) or `quantize_row_ref`.
    entry: String,
    rows: usize,
    per_row: usize,
    has_dequant: bool,
}

fn ggml_ref_manifest() -> Vec<GgmlRef> {
    let text = String::from_utf8(read("ggml_ref/manifest.txt")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 6, "bad manifest line {l:?}");
            GgmlRef {
                dtype: DType::from_name(f[0]).unwrap(),
                entry: f[1].to_string(),
                rows: f[2].parse().unwrap(),
                per_row: f[3].parse().unwrap(),
                has_dequant: f[5] == "deq",
            }
        })
        .collect()
}

fn assert_same_bytes(dtype: DType, what: &str, got: &[u8], expect: &[u8]) {
    assert_eq!(got.len(), expect.len(), "{dtype} {what}");
    if let Some((i, g, e)) = first_diff(got, expect) {
        let bb = dtype.block_bytes();
        panic!(
            "{dtype} {what}: byte {i} (block {}, offset {}): got {g:#04x}, ggml {e:#04x}",
            i / bb,
            i % bb
        );
    }
}

#[test]
fn ggml_ref_manifest_covers_every_quantized_type_via_llama_quantize_path() {
    let m = ggml_ref_manifest();
    for dtype in DType::ALL.into_iter().filter(|t| t.is_quantized()) {
        let f = m.iter().find(|f| f.dtype == dtype);
        let f = f.unwrap_or_else(|| panic!("{dtype}: no ggml_ref fixture"));
        // Weight types come from the entry point llama-quantize uses; only the activation
        // types (which ggml never writes to files) come from the row reference.
        let activation = matches!(dtype, DType::Q8_1 | DType::Q8_K);
        let want = if activation {
            "quantize_row_ref"
        } else {
            "quantize_NULL"
        };
        assert_eq!(f.entry, want, "{dtype}");
    }
    for t in [
        DType::Q2_K,
        DType::Q3_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ] {
        assert!(m.iter().any(|f| f.dtype == t && f.has_dequant), "{t}");
    }
}

/// ggml's own C quantizers as llama-quantize calls them without an importance matrix
/// (`quantize_<type>(src, dst, nrow, n_per_row, NULL)`; `quantize_row_*_ref` for Q8_1/Q8_K),
/// for every quantized type including those gguf-py cannot quantize. Made by
/// `scripts/ggml_ref/gen.sh`. rgml must give the same bytes whether the input is handed over
/// as one row or as ggml's rows.
#[test]
fn quantize_is_bit_identical_to_ggml_c_reference() {
    let input = read_f32("ggml_ref/input.f32");
    for f in ggml_ref_manifest() {
        let dtype = f.dtype;
        assert_eq!(f.rows * f.per_row, input.len(), "{dtype}");
        let expect = read(&format!("ggml_ref/{}.bin", dtype.name()));
        let mut got = vec![0u8; dtype.row_bytes(input.len()).unwrap()];
        quantize_row(dtype, &input, &mut got).unwrap();
        assert_same_bytes(dtype, "as one row", &got, &expect);
        let row_bytes = dtype.row_bytes(f.per_row).unwrap();
        let mut by_row = vec![0u8; got.len()];
        for (x, out) in input
            .chunks_exact(f.per_row)
            .zip(by_row.chunks_exact_mut(row_bytes))
        {
            quantize_row(dtype, x, out).unwrap();
        }
        assert_same_bytes(dtype, "row by row", &by_row, &expect);
    }
}

/// ggml's `dequantize_row_*` of its own bytes, for the types the gguf-py fixtures lack.
#[test]
fn dequantize_is_bit_identical_to_ggml_c_reference() {
    for f in ggml_ref_manifest().into_iter().filter(|f| f.has_dequant) {
        let name = f.dtype.name();
        assert_same_values(f.dtype, &format!("ggml_ref/{name}"));
    }
}

/// `dequantize_row(dtype, <stem>.bin)` has the bits of `<stem>.deq.f32`.
fn assert_same_values(dtype: DType, stem: &str) {
    let bytes = read(&format!("{stem}.bin"));
    let expect = read_f32(&format!("{stem}.deq.f32"));
    let mut got = vec![0.0f32; expect.len()];
    dequantize_row(dtype, &bytes, &mut got).unwrap();
    let got_bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
    let expect_bits: Vec<u32> = expect.iter().map(|v| v.to_bits()).collect();
    if let Some((i, g, e)) = first_diff(&got_bits, &expect_bits) {
        panic!(
            "{stem}: element {i}: got {} ({g:#010x}), ggml {} ({e:#010x})",
            f32::from_bits(*g),
            f32::from_bits(*e)
        );
    }
}

/// MXFP4's edge blocks (`mxfp4_edges.f32`, see `scripts/ggml_ref/gen.sh`): exact powers of two
/// and magnitudes just below them (where glibc's `log2f` rounds up), ties between codes, zero
/// blocks, exponents outside E8M0's range and non-finite values give ggml's bytes, and those
/// bytes decode to ggml's values.
#[test]
fn mxfp4_edge_blocks_are_bit_identical_to_ggml_c_reference() {
    let input = read_f32("ggml_ref/mxfp4_edges.f32");
    let expect = read("ggml_ref/mxfp4_edges.bin");
    let mut got = vec![0u8; DType::MXFP4.row_bytes(input.len()).unwrap()];
    quantize_row(DType::MXFP4, &input, &mut got).unwrap();
    assert_same_bytes(DType::MXFP4, "edge blocks", &got, &expect);
    assert_same_values(DType::MXFP4, "ggml_ref/mxfp4_edges");
}
