//! Tokenizer parity with llama.cpp. Each fixture of `fixtures/tokens/` (made by
//! `scripts/gen_token_fixtures.py`) names a GGUF file under `models/` and holds llama.cpp's
//! token ids, per-token pieces and detokenized texts for a set of prompts, and what llama.cpp
//! derives for the whole vocabulary (special ids, end-of-generation set, every token's
//! attributes); rgml's tokenizer, built from the same file, must give the same.
//!
//! The files come from `scripts/fetch-model.sh` (Gemma 3, SmolLM2) and
//! `scripts/fetch-vocab.sh` (llama.cpp's vocabulary-only files); each is checked by sha256
//! so a different file fails as such rather than as a tokenizer bug. A fixture with a
//! `pre` name was made from a copy of its file with `tokenizer.ggml.pre` set to that name
//! (for pre-tokenizers llama.cpp ships no vocabulary for); the test makes the same copy in
//! the temporary directory with rgml's GGUF writer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rgml_gguf::{GgufFile, GgufWriter, Value as GgufValue};
use rgml_llm::tokenizer::{EncodeOptions, TokenId, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One tokenization llama.cpp made.
struct Case {
    prompt: String,
    options: EncodeOptions,
    tokens: Vec<TokenId>,
    /// `llama_token_to_piece` of each token, special tokens rendered.
    pieces: Vec<Vec<u8>>,
    /// `llama_detokenize` of `tokens`, special tokens rendered.
    text: Vec<u8>,
    /// `llama_detokenize` of `tokens`, special tokens not rendered.
    text_plain: Vec<u8>,
}

/// A fixture: the file it was made from, llama.cpp's view of its vocabulary and the cases.
struct Fixture {
    file: String,
    sha256: String,
    /// The `tokenizer.ggml.pre` the file was relabelled with before tokenizing, if any.
    pre: Option<String>,
    vocab: Value,
    cases: Vec<Case>,
}

/// A string, or a list of byte values where llama.cpp's output was not UTF-8.
fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(a) => a
            .iter()
            .map(|b| {
                b.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .expect("byte value")
            })
            .collect(),
        other => panic!("expected a string or bytes, got {other}"),
    }
}

fn parse_case(c: &Value) -> Case {
    let flag = |k: &str| c[k].as_bool().unwrap_or_else(|| panic!("{k} in {c}"));
    Case {
        prompt: c["prompt"].as_str().expect("prompt").to_owned(),
        options: EncodeOptions {
            add_special: flag("add_special"),
            parse_special: flag("parse_special"),
        },
        tokens: c["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| TokenId::try_from(t).ok())
                    .expect("id")
            })
            .collect(),
        pieces: c["pieces"]
            .as_array()
            .expect("pieces")
            .iter()
            .map(bytes)
            .collect(),
        text: bytes(&c["text"]),
        text_plain: bytes(&c["text_plain"]),
    }
}

fn parse_fixture(json: &str) -> Fixture {
    let v: Value = serde_json::from_str(json).expect("fixture JSON");
    Fixture {
        file: v["file"].as_str().expect("file").to_owned(),
        sha256: v["sha256"].as_str().expect("sha256").to_owned(),
        pre: v["pre"].as_str().map(str::to_owned),
        vocab: v["vocab"].clone(),
        cases: v["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(parse_case)
            .collect(),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Opens the fixture's file (relative to the workspace root), checks its sha256, relabels
/// it where the fixture says and builds its tokenizer, reporting how long that took.
fn load(fx: &Fixture) -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(&fx.file);
    assert!(
        path.exists(),
        "{} not found: run scripts/fetch-model.sh and scripts/fetch-vocab.sh first",
        path.display()
    );
    let file = GgufFile::open(&path).expect("open the GGUF file");
    assert_eq!(
        sha256_hex(&std::fs::read(&path).expect("read the GGUF file")),
        fx.sha256,
        "{} is not the file the fixture was made from",
        path.display()
    );
    let t0 = Instant::now();
    let tok = match &fx.pre {
        None => Tokenizer::from_gguf(&file).expect("tokenizer from GGUF"),
        Some(pre) => relabelled_tokenizer(&file, pre),
    };
    eprintln!(
        "{}{}: {} tokens, tokenizer built in {:?}",
        fx.file,
        fx.pre
            .as_ref()
            .map_or(String::new(), |p| format!(" as {p}")),
        tok.n_vocab(),
        t0.elapsed()
    );
    tok
}

/// The tokenizer of a copy of `file` with `tokenizer.ggml.pre` set to `pre`, written to the
/// temporary directory (under a name of its own: tests run in parallel) and removed again.
fn relabelled_tokenizer(file: &GgufFile, pre: &str) -> Tokenizer {
    static COPIES: AtomicUsize = AtomicUsize::new(0);
    let mut w = GgufWriter::from_file(file).expect("copy the GGUF file");
    w.add_metadata("tokenizer.ggml.pre", GgufValue::String(pre.to_owned()));
    let copy = TempFile(std::env::temp_dir().join(format!(
        "rgml-tokenizer-parity-{}-{}-{pre}.gguf",
        std::process::id(),
        COPIES.fetch_add(1, Ordering::Relaxed)
    )));
    w.write_file(&copy.0).expect("write the relabelled copy");
    let relabelled = GgufFile::open(&copy.0).expect("open the relabelled copy");
    assert_eq!(relabelled.get_str("tokenizer.ggml.pre").ok(), Some(pre));
    Tokenizer::from_gguf(&relabelled).expect("tokenizer from the relabelled copy")
}

/// A file removed when dropped, so a failing test leaves none behind.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        // Nothing to do if it is already gone or was never written.
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Where two sequences first differ (the shorter one's length if one is a prefix).
fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    (common < a.len().max(b.len())).then_some(common)
}

/// Every way `tok` disagrees with llama.cpp on `case`, as messages.
fn check_case(tok: &Tokenizer, case: &Case) -> Vec<String> {
    let mut errors = Vec::new();
    let got = tok.encode(&case.prompt, case.options);
    if let Some(i) = first_difference(&got, &case.tokens) {
        errors.push(format!(
            "ids differ at position {i}\n  rgml:      {got:?}\n  llama.cpp: {:?}",
            case.tokens
        ));
    }
    for (i, (&id, want)) in case.tokens.iter().zip(&case.pieces).enumerate() {
        match tok.token_to_piece(id, true) {
            Ok(p) if p == want.as_slice() => {}
            other => errors.push(format!(
                "piece of token {id} (position {i}): rgml {:?}, llama.cpp {:?}",
                other.map(String::from_utf8_lossy),
                String::from_utf8_lossy(want)
            )),
        }
    }
    for (special, want) in [(true, &case.text), (false, &case.text_plain)] {
        match tok.decode_bytes(&case.tokens, special) {
            Ok(text) if text == *want => {}
            other => errors.push(format!(
                "decoded text (special: {special}) differs\n  rgml:      {:?}\n  llama.cpp: {:?}",
                other.map(|t| String::from_utf8_lossy(&t).into_owned()),
                String::from_utf8_lossy(want)
            )),
        }
    }
    errors
}

/// An optional id as the fixture writes it (`null` for none).
fn id_json(id: Option<TokenId>) -> Value {
    id.map_or(Value::Null, Value::from)
}

/// Every way `tok`'s vocabulary-wide facts disagree with llama.cpp's (`want`).
fn check_vocab(tok: &Tokenizer, want: &Value) -> Vec<String> {
    let fim = tok.fim();
    let eog: Vec<Value> = tok.eog_ids().iter().map(|&id| Value::from(id)).collect();
    let got = [
        ("n_tokens", Value::from(tok.n_vocab())),
        ("bos", id_json(tok.bos())),
        ("eos", id_json(tok.eos())),
        ("pad", id_json(tok.pad())),
        (
            "fim",
            Value::Array(
                [fim.pre, fim.suf, fim.mid, fim.pad, fim.rep, fim.sep]
                    .into_iter()
                    .map(id_json)
                    .collect(),
            ),
        ),
        ("add_bos", Value::from(tok.add_bos())),
        ("add_eos", Value::from(tok.add_eos())),
        ("eog", Value::Array(eog)),
    ];
    let mut errors: Vec<String> = got
        .into_iter()
        .filter(|(k, v)| want[*k] != *v)
        .map(|(k, v)| format!("{k}: rgml {v}, llama.cpp {}", want[k]))
        .collect();
    errors.extend(check_attrs(tok, want["attrs"].as_array().expect("attrs")));
    errors
}

/// Compares every token's attribute bits with llama.cpp's runs `[first, count, attr]`;
/// reports the first few tokens that differ.
fn check_attrs(tok: &Tokenizer, runs: &[Value]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut covered = 0;
    for run in runs {
        let n = |i: usize| run[i].as_u64().expect("attr run");
        let (first, count, want) = (n(0), n(1), n(2));
        covered += count;
        for id in first..first + count {
            let id = TokenId::try_from(id).expect("id");
            let got = tok.token_attr(id).map(|a| u64::from(a.bits()));
            if got != Some(want) && errors.len() < 10 {
                errors.push(format!(
                    "attributes of token {id} {:?}: rgml {:?}, llama.cpp {want}",
                    tok.token_text(id),
                    tok.token_attr(id)
                ));
            }
        }
    }
    if covered != tok.n_vocab() as u64 {
        errors.push(format!("attribute runs cover {covered} tokens"));
    }
    errors
}

/// Checks every case of a fixture and fails listing each case that differs.
fn check(json: &str) {
    let fx = parse_fixture(json);
    assert!(!fx.cases.is_empty(), "{}: no cases", fx.file);
    let tok = load(&fx);
    let mut failures = Vec::new();
    let vocab_errors = check_vocab(&tok, &fx.vocab);
    if !vocab_errors.is_empty() {
        failures.push(format!("vocabulary:\n{}", vocab_errors.join("\n")));
    }
    for case in &fx.cases {
        let errors = check_case(&tok, case);
        if !errors.is_empty() {
            failures.push(format!(
                "prompt {:?} ({:?}):\n{}",
                case.prompt,
                case.options,
                errors.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {} cases (or the vocabulary) differ from llama.cpp\n\n{}",
        fx.file,
        failures.len(),
        fx.cases.len(),
        failures.join("\n\n")
    );
}

#[test]
fn gemma3_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/gemma-3-270m-q4_k_m.json"));
}

#[test]
fn llama3_bpe_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-llama-bpe.json"));
}

#[test]
fn qwen2_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-qwen2.json"));
}

/// Qwen 3.5's pre-tokenizer (`qwen35`: combining marks join letter runs), on llama.cpp's
/// vocabulary file for it (Qwen2's tokens and merges under that pre-tokenizer).
#[test]
fn qwen35_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-qwen35.json"));
}

/// BERT's WordPiece (`bert`) on llama.cpp's bge vocabulary: lower case, accents stripped,
/// CJK ideographs and punctuation as words of their own, `[CLS]`/`[SEP]` around the text.
#[test]
fn bert_bge_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-bert-bge.json"));
}

/// Texts whose ids depend on combining marks joining letter runs, with llama.cpp's ids for
/// `ggml-vocab-qwen35.gguf` (under Qwen 2's pre-tokenizer the same vocabulary gives others).
#[test]
fn qwen35_marks_join_letter_runs_as_in_llama_cpp() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/vocab/ggml-vocab-qwen35.gguf");
    let file = GgufFile::open(&path).expect("run scripts/fetch-vocab.sh first");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer from GGUF");
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    let cases: [(&str, &[TokenId]); 2] = [
        (
            "Ti\u{ea}\u{301}ng Vi\u{ea}\u{323}t",
            &[45351, 132515, 968, 11401, 132840, 83],
        ),
        (
            "\u{e2a}\u{e27}\u{e31}\u{e2a}\u{e14}\u{e35}\u{e04}\u{e23}\u{e31}\u{e1a}",
            &[35648, 124294, 35648, 124311, 125459],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode(text, plain), want, "{text:?}");
    }
}

/// GPT-4o's pre-tokenizer (`gpt-4o`, as gpt-oss files name it), on Llama 3's vocabulary
/// relabelled: llama.cpp ships no vocabulary for it, and the split alone is under test.
#[test]
fn gpt4o_matches_llama_cpp() {
    check(include_str!(
        "fixtures/tokens/ggml-vocab-llama-bpe.gpt-4o.json"
    ));
}

/// Texts that GPT-4o's split, as llama.cpp runs it, tokenizes unlike Llama 3's, with
/// llama.cpp's ids for Llama 3's vocabulary relabelled `gpt-4o`: a contraction joins its
/// word and case changes split words; punctuation takes a newline and a slash after it;
/// and `Ü`, a non-ASCII letter, counts as lower case too, so `ZÜRICH` splits after it (the
/// textbook reading of the regex keeps it whole, as Llama 3's does). Each text is checked
/// to tokenize otherwise under the file's own `llama-bpe`, so the test fails if `gpt-4o`
/// is read as Llama 3's pre-tokenizer.
#[test]
fn gpt4o_splits_unlike_llama3() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/vocab/ggml-vocab-llama-bpe.gguf");
    let file = GgufFile::open(&path).expect("run scripts/fetch-vocab.sh first");
    let llama3 = Tokenizer::from_gguf(&file).expect("tokenizer from GGUF");
    let gpt4o = relabelled_tokenizer(&file, "gpt-4o");
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    let cases: [(&str, &[TokenId]); 3] = [
        (
            "I don't know, McDONALD'S iPhone",
            &[
                40, 1541, 956, 1440, 11, 4584, 85741, 984, 35, 13575, 602, 7084,
            ],
        ),
        ("end./\n/x", &[408, 1761, 198, 14, 87]),
        ("Z\u{dc}RICH", &[57, 53591, 49, 33929]),
    ];
    for (text, want) in cases {
        assert_eq!(gpt4o.encode(text, plain), want, "{text:?}");
        assert_ne!(
            llama3.encode(text, plain),
            want,
            "{text:?} does not tell them apart"
        );
    }
}

/// Gemma 4 (`tokenizer.ggml.model = gemma4`): BPE over raw UTF-8 with spaces as `▁`, split
/// only at newline runs, `<0xXX>` byte fallback, BOS forced on; llama.cpp's `.inp` cases
/// included.
#[test]
fn gemma4_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-gemma-4.json"));
}

#[test]
fn phi3_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-phi-3.json"));
}

#[test]
fn llama_spm_matches_llama_cpp() {
    check(include_str!("fixtures/tokens/ggml-vocab-llama-spm.json"));
}

#[test]
fn smollm2_matches_llama_cpp() {
    check(include_str!(
        "fixtures/tokens/SmolLM2-135M-Instruct.Q4_1.json"
    ));
}

#[test]
fn first_difference_finds_the_position() {
    assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
    assert_eq!(first_difference(&[1, 2, 3], &[1, 5, 3]), Some(1));
    assert_eq!(first_difference(&[1, 2], &[1, 2, 3]), Some(2));
    assert_eq!(first_difference::<u32>(&[], &[]), None);
}
