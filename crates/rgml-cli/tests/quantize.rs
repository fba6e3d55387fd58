//! `rgml quantize` against llama.cpp's `llama-quantize`: the demo model quantized to each
//! preset must be the very bytes llama-quantize wrote (their sha256 are in
//! `tests/fixtures/quantize.json`, made by `scripts/gen_quantize_fixtures.sh`); and the
//! command's errors and exit statuses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "demo model not found at {}: run scripts/fetch-model.sh first",
        path.display()
    );
    path
}

fn rgml(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rgml"))
        .arg("quantize")
        .args(args)
        .output()
        .expect("run rgml")
}

/// A fresh directory for one test's outputs.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rgml-quantize-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// The presets whose every type rgml encodes today: these must match, never be skipped.
/// The others (Q2_K, Q3_K_*, IQ4_*) are checked as soon as rgml supports their types.
const SUPPORTED: [&str; 13] = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16",
    "BF16", "F32",
];

/// The presets checked by default (about 2 s each in the test profile on 2 cores): every code
/// path (legacy and k-quant rules, the demo's fallbacks Q4_K -> Q5_0, Q5_K -> Q5_1,
/// Q6_K -> Q8_0, float conversion) and the presets waiting for their types. All of the
/// fixture's presets with `RGML_QUANTIZE_ALL=1` (about a minute).
const DEFAULT: [&str; 11] = [
    "Q4_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "F16", "Q2_K", "Q3_K_M", "IQ4_NL", "IQ4_XS",
];

#[test]
fn demo_model_quantizes_to_llama_quantize_bytes() {
    let text = std::fs::read_to_string(root().join("crates/rgml-cli/tests/fixtures/quantize.json"))
        .expect("quantize.json");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let model = model();
    let model_sha = sha256::hex(&std::fs::read(&model).expect("read model"));
    assert_eq!(
        fixture["model_sha256"].as_str(),
        Some(model_sha.as_str()),
        "not the fixture's model"
    );
    let outputs = fixture["outputs"].as_object().expect("outputs");
    for name in SUPPORTED {
        assert!(outputs.contains_key(name), "fixture lacks {name}");
    }
    let all = std::env::var("RGML_QUANTIZE_ALL").is_ok_and(|v| v == "1");
    let dir = scratch("presets");
    let mut checked = Vec::new();
    for (preset, expected) in outputs {
        if !all && !DEFAULT.contains(&preset.as_str()) {
            continue;
        }
        let out = dir.join(format!("{preset}.gguf"));
        let run = Command::new(env!("CARGO_BIN_EXE_rgml"))
            .args(["quantize", "-q", "--allow-requantize", "-t", "2"])
            .args([model.as_os_str(), out.as_os_str()])
            .arg(preset)
            .output()
            .expect("run rgml");
        let stderr = String::from_utf8_lossy(&run.stderr);
        if !run.status.success() && !SUPPORTED.contains(&preset.as_str()) {
            assert!(
                stderr.contains("is not supported yet"),
                "{preset}: {stderr}"
            );
            eprintln!("{preset}: not supported yet, skipped");
            continue;
        }
        assert!(run.status.success(), "{preset}: {stderr}");
        let bytes = std::fs::read(&out).expect("read output");
        std::fs::remove_file(&out).expect("remove output");
        assert_eq!(
            Some(bytes.len() as u64),
            expected["bytes"].as_u64(),
            "{preset}: size"
        );
        assert_eq!(
            Some(sha256::hex(&bytes).as_str()),
            expected["sha256"].as_str(),
            "{preset}: not llama-quantize's bytes"
        );
        checked.push(preset.clone());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let wanted = if all { SUPPORTED.len() } else { 7 };
    assert!(checked.len() >= wanted, "checked only {checked:?}");
}

#[test]
fn unknown_type_is_a_usage_error() {
    let dir = scratch("unknown");
    let out = rgml(&[&model(), &dir.join("o.gguf"), Path::new("Q9_9")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("Q9_9") && stderr.contains("Q4_K_M"),
        "{stderr}"
    );
    assert!(!dir.join("o.gguf").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn requantizing_needs_the_flag_and_leaves_no_file() {
    let dir = scratch("requant");
    let target = dir.join("o.gguf");
    let out = rgml(&[&model(), &target, Path::new("Q8_0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("requantizing from type q4_1 is disabled")
            && stderr.contains("--allow-requantize")
            && stderr.contains("tensor 'blk.0.attn_k.weight'"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).expect("read dir").collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_input_is_a_runtime_error() {
    let dir = scratch("missing");
    let input = dir.join("absent.gguf");
    let out = rgml(&[&input, &dir.join("o.gguf"), Path::new("Q8_0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("absent.gguf"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn output_must_not_be_the_input() {
    let dir = scratch("same");
    let copy = dir.join("m.gguf");
    std::fs::copy(model(), &copy).expect("copy model");
    let before = std::fs::read(&copy).expect("read copy");
    // The same file under another spelling of its path.
    let other = dir.join(".").join("m.gguf");
    let out = rgml(&[
        &copy,
        &other,
        Path::new("Q8_0"),
        Path::new("--allow-requantize"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the output is the input"), "{stderr}");
    assert_eq!(
        std::fs::read(&copy).expect("read copy"),
        before,
        "input changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sha256_known_answers() {
    assert_eq!(
        sha256::hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256::hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let long = vec![b'a'; 1_000_000];
    assert_eq!(
        sha256::hex(&long),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    );
}

/// SHA-256 (FIPS 180-4), enough to check fixture hashes without another dependency.
mod sha256 {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];

    fn compress(h: &mut [u32; 8], block: &[u8]) {
        let mut w = [0u32; 64];
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = *h;
        for i in 0..64 {
            let [a, b, c, d, e, f, g, hh] = v;
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            v = [t1.wrapping_add(t2), a, b, c, d.wrapping_add(t1), e, f, g];
        }
        for (x, y) in h.iter_mut().zip(v) {
            *x = x.wrapping_add(y);
        }
    }

    /// The digest of `data` in lower-case hex.
    pub fn hex(data: &[u8]) -> String {
        let mut h: [u32; 8] = [
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
            0x5be0cd19,
        ];
        let whole = data.len() / 64 * 64;
        for block in data[..whole].chunks_exact(64) {
            compress(&mut h, block);
        }
        let mut tail = data[whole..].to_vec();
        tail.push(0x80);
        while tail.len() % 64 != 56 {
            tail.push(0);
        }
        tail.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
        for block in tail.chunks_exact(64) {
            compress(&mut h, block);
        }
        h.iter().map(|x| format!("{x:08x}")).collect()
    }
}
