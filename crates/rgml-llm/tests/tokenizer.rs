//! Tokenizer tests: the demo model's ids against llama.cpp's (fixtures/reference.json),
//! round trips, streaming decode, edge cases, and SentencePiece on a hand-made vocabulary.

mod common;

use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rgml_gguf::{GgufFile, GgufWriter, Value};
use rgml_llm::tokenizer::{
    EncodeOptions, PreTokenizer, TokenType, Tokenizer, TokenizerKind, TokenizerParts,
};
use rgml_llm::LlmError;

/// The demo model's tokenizer, loaded once for all tests.
fn smollm() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = common::demo_model_path();
        let file = GgufFile::open(&path).unwrap();
        Tokenizer::from_gguf(&file).unwrap()
    })
}

struct Case {
    prompt: String,
    tokens: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let text = include_str!("fixtures/reference.json");
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(v["add_bos"], serde_json::Value::Bool(false));
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap().to_owned(),
            tokens: c["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
        })
        .collect()
}

#[test]
fn smollm_metadata() {
    let tok = smollm();
    assert_eq!(tok.kind(), TokenizerKind::Bpe);
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Starcoder));
    assert_eq!(tok.n_vocab(), 49152);
    assert!(!tok.add_bos());
    assert!(!tok.add_eos());
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_type(1), Some(TokenType::Control));
    // <|im_end|> (EOS) and <|endoftext|> both end generation.
    assert!(tok.is_eog(2));
    assert!(tok.is_eog(0));
    assert!(!tok.is_eog(1));
}

#[test]
fn smollm_matches_llama_cpp() {
    let tok = smollm();
    let cases = cases();
    assert!(cases.len() >= 4);
    for c in &cases {
        let got = tok.encode(&c.prompt, EncodeOptions::prompt());
        assert_eq!(got, c.tokens, "prompt {:?}", c.prompt);
    }
}

#[test]
fn smollm_round_trip_prompts() {
    let tok = smollm();
    for c in cases() {
        assert_eq!(tok.decode(&c.tokens, true).unwrap(), c.prompt);
    }
}

#[test]
fn smollm_special_tokens_parsing_and_rendering() {
    let tok = smollm();
    let text = "<|im_start|>user\nhi<|im_end|>";
    let parsed = tok.encode(
        text,
        EncodeOptions {
            add_special: false,
            parse_special: true,
        },
    );
    assert_eq!(parsed.first(), Some(&1));
    assert_eq!(parsed.last(), Some(&2));
    // Not parsed: the markers are plain text and no control id appears.
    let plain = tok.encode(text, EncodeOptions::default());
    assert!(!plain.contains(&1) && !plain.contains(&2));
    assert_eq!(tok.decode(&plain, false).unwrap(), text);
    // Rendering control tokens is opt-in.
    assert_eq!(tok.decode(&parsed, false).unwrap(), "user\nhi");
    assert_eq!(tok.decode(&parsed, true).unwrap(), text);
    // Adjacent specials and a special at both ends.
    assert_eq!(
        tok.encode(
            "<|im_end|><|im_start|>",
            EncodeOptions {
                add_special: false,
                parse_special: true
            }
        ),
        vec![2, 1]
    );
}

#[test]
fn smollm_edge_cases() {
    let tok = smollm();
    assert!(tok.encode("", EncodeOptions::prompt()).is_empty());
    assert_eq!(tok.decode(&[], true).unwrap(), "");
    for spaces in [" ", "  ", "     ", "\n", " \n ", "\t\t"] {
        let ids = tok.encode(spaces, EncodeOptions::default());
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids, false).unwrap(), spaces);
    }
    // smollm isolates every digit: one token per digit, whatever the run length.
    let digits = "31415926535897932384626433832795";
    let ids = tok.encode(digits, EncodeOptions::default());
    assert_eq!(ids.len(), digits.len());
    for (id, d) in ids.iter().zip(digits.bytes()) {
        assert_eq!(tok.token_to_piece(*id, false).unwrap(), &[d]);
    }
    for s in [
        "🚀",
        "👩‍👩‍👧",
        "日本語のテキスト",
        "ﷺ",
        "\u{10FFFF}",
        "a\u{0301}",
    ] {
        let ids = tok.encode(s, EncodeOptions::default());
        assert_eq!(tok.decode(&ids, false).unwrap(), s, "{s:?}");
    }
    // Invalid ids are errors, not panics.
    let n = tok.n_vocab() as u32;
    assert!(matches!(
        tok.decode(&[5, n], false),
        Err(LlmError::InvalidToken { id, .. }) if id == n
    ));
    assert!(tok.token_to_piece(u32::MAX, true).is_err());
    assert!(tok.decoder(false).push(n).is_err());
}

fn random_text(rng: &mut impl Rng, len: usize) -> String {
    const POOL: &[char] = &[
        'a', 'Z', ' ', ' ', '\n', '\t', '1', '9', '\'', 's', '.', ',', '!', 'é', 'ß', 'Ω', 'ж',
        '中', '日', '🚀', '😀', '\u{0301}', '\u{00A0}', '\u{3000}', '٣', '²', '$', '<', '|', '>',
        '_',
    ];
    (0..len)
        .map(|_| {
            if rng.gen_bool(0.2) {
                // Any scalar value, assigned or not, whose UTF-8 bytes all have a token:
                // SmolLM2's vocabulary lacks the lead bytes 0xF1 and 0xF2 (U+40000..U+BFFFF)
                // and a few C0 controls (see `smollm_drops_bytes_without_token`).
                loop {
                    let cp = rng.gen_range(0x20..0x11_0000);
                    if (0x4_0000..0xC_0000).contains(&cp) || cp == 0x7F {
                        continue;
                    }
                    if let Some(c) = char::from_u32(cp) {
                        break c;
                    }
                }
            } else {
                POOL[rng.gen_range(0..POOL.len())]
            }
        })
        .collect()
}

#[test]
fn smollm_round_trip_random_unicode() {
    let tok = smollm();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..300 {
        let len = rng.gen_range(0..40);
        let s = random_text(&mut rng, len);
        let ids = tok.encode(&s, EncodeOptions::default());
        assert_eq!(tok.decode(&ids, false).unwrap(), s, "{s:?}");
    }
}

#[test]
fn smollm_drops_bytes_without_token() {
    // SmolLM2 has no token for the bytes 0x04 or 0xF1; llama.cpp's fallback (one-byte tokens
    // of the piece) finds none and drops them, and so do we.
    let tok = smollm();
    assert!(tok.encode("\u{4}", EncodeOptions::default()).is_empty());
    let ids = tok.encode("a\u{4}b", EncodeOptions::default());
    assert_eq!(tok.decode(&ids, false).unwrap(), "ab");
}

/// Streams `ids` through a decoder and checks the pieces add up to `decode`.
fn check_stream(tok: &Tokenizer, ids: &[u32], special: bool) {
    let mut dec = tok.decoder(special);
    let mut streamed = String::new();
    for &id in ids {
        streamed += &dec.push(id).unwrap();
    }
    streamed += &dec.finish();
    assert_eq!(streamed, tok.decode(ids, special).unwrap(), "{ids:?}");
}

#[test]
fn smollm_streaming_decode_equals_whole() {
    let tok = smollm();
    for c in cases() {
        check_stream(tok, &c.tokens, true);
        check_stream(tok, &c.tokens, false);
    }
    // An emoji split over byte tokens: nothing is printed until it is complete.
    let ids = tok.encode("🚀", EncodeOptions::default());
    assert!(ids.len() > 1);
    let mut dec = tok.decoder(false);
    let outs: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
    assert!(outs[..outs.len() - 1].iter().all(String::is_empty));
    assert_eq!(outs.last().map(String::as_str), Some("🚀"));
    // Arbitrary id sequences (invalid UTF-8 included) stream to the same lossy text.
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..200 {
        let ids: Vec<u32> = (0..rng.gen_range(0..12))
            .map(|_| rng.gen_range(0..tok.n_vocab() as u32))
            .collect();
        check_stream(tok, &ids, rng.gen_bool(0.5));
    }
    // Cut inside a character: the tail comes out of finish() as U+FFFD.
    let mut dec = tok.decoder(false);
    assert_eq!(dec.push(ids[0]).unwrap(), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
}

#[test]
fn smollm_encodes_10kb_quickly() {
    let tok = smollm();
    let base = include_str!("fixtures/reference.json");
    let text: String = base.chars().cycle().take(10_000).collect();
    let t0 = std::time::Instant::now();
    let ids = tok.encode(&text, EncodeOptions::default());
    let dt = t0.elapsed();
    eprintln!("10 KB -> {} tokens in {dt:?}", ids.len());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // Generous bound for a loaded 2-core machine; typical is a few milliseconds.
    assert!(dt.as_millis() < 500, "encoding 10 KB took {dt:?}");
}

// ---------------------------------------------------------------------------------------
// SentencePiece on a hand-made vocabulary.

/// ids: 0 <unk>, 1 <s>, 2 </s>, 3..=258 <0x00>..<0xFF>, then the pieces below.
const SPM_PIECES: &[(&str, f32)] = &[
    ("▁", -1.0),   // 259
    ("a", -2.0),   // 260
    ("b", -2.0),   // 261
    ("c", -2.0),   // 262
    ("ab", -0.5),  // 263
    ("▁ab", -0.2), // 264
    ("bc", -0.1),  // 265
    ("▁a", -3.0),  // 266
];

fn spm_parts() -> TokenizerParts {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![TokenType::Unknown, TokenType::Control, TokenType::Control];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte);
        scores.push(0.0);
    }
    for (t, s) in SPM_PIECES {
        tokens.push((*t).to_owned());
        types.push(TokenType::Normal);
        scores.push(*s);
    }
    TokenizerParts {
        kind: TokenizerKind::Spm,
        tokens,
        scores,
        token_types: types,
        ..TokenizerParts::default()
    }
}

fn byte(b: u8) -> u32 {
    3 + b as u32
}

#[test]
fn spm_hand_worked() {
    let tok = Tokenizer::from_parts(spm_parts()).unwrap();
    // Defaults of a SentencePiece vocabulary.
    assert_eq!(
        (tok.bos(), tok.eos(), tok.unk()),
        (Some(1), Some(2), Some(0))
    );
    assert!(tok.add_bos());

    // "▁abc": "bc" (-0.1) outranks "ab" (-0.5) though it is further right; then "▁a" (-3).
    assert_eq!(tok.encode("abc", EncodeOptions::default()), vec![266, 265]);
    // "▁ab": "ab" first, then "▁ab" (-0.2) becomes possible.
    assert_eq!(tok.encode("ab", EncodeOptions::default()), vec![264]);
    // BOS with add_special.
    assert_eq!(
        tok.encode(
            "ab",
            EncodeOptions {
                add_special: true,
                parse_special: false
            }
        ),
        vec![1, 264]
    );
    // Spaces are ▁; "▁b" is no token.
    assert_eq!(
        tok.encode("a b", EncodeOptions::default()),
        vec![266, 259, 261]
    );
    // No piece for é: byte fallback of its UTF-8.
    assert_eq!(
        tok.encode("é", EncodeOptions::default()),
        vec![259, byte(0xC3), byte(0xA9)]
    );
    // Specials split the text; the text after one gets the space prefix again.
    assert_eq!(
        tok.encode(
            "ab<s>ab",
            EncodeOptions {
                add_special: false,
                parse_special: true
            }
        ),
        vec![264, 1, 264]
    );
    assert_eq!(
        tok.encode(
            "<s>ab",
            EncodeOptions {
                add_special: false,
                parse_special: true
            }
        ),
        vec![1, 264]
    );
    assert!(tok.encode("", EncodeOptions::default()).is_empty());

    // Decoding drops the prefix space of the first token only.
    assert_eq!(tok.decode(&[266, 265], false).unwrap(), "abc");
    assert_eq!(
        tok.decode(&[259, byte(0xC3), byte(0xA9)], false).unwrap(),
        "é"
    );
    assert_eq!(tok.decode(&[264, 1, 264], true).unwrap(), "ab<s> ab");
    assert_eq!(tok.decode(&[264, 1, 264], false).unwrap(), "ab ab");
    for s in ["abc", "a b", "é", "  cab  ", "日本 🚀"] {
        let ids = tok.encode(s, EncodeOptions::default());
        assert_eq!(tok.decode(&ids, false).unwrap(), s);
        check_stream(&tok, &ids, false);
    }
}

#[test]
fn spm_from_gguf_metadata() {
    let parts = spm_parts();
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        Value::Array(parts.tokens.iter().cloned().map(Value::String).collect()),
    );
    w.add_metadata(
        "tokenizer.ggml.scores",
        Value::Array(parts.scores.iter().copied().map(Value::F32).collect()),
    );
    let types = parts.token_types.iter().map(|t| match t {
        TokenType::Unknown => 2,
        TokenType::Control => 3,
        TokenType::Byte => 6,
        _ => 1,
    });
    w.add_metadata(
        "tokenizer.ggml.token_type",
        Value::Array(types.map(Value::I32).collect()),
    );
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.add_metadata("tokenizer.ggml.add_eos_token", Value::Bool(true));
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.kind(), TokenizerKind::Spm);
    assert_eq!(
        tok.encode(
            "abc",
            EncodeOptions {
                add_special: true,
                parse_special: false
            }
        ),
        vec![266, 265, 2]
    );
    assert!(tok.is_eog(2));
}

#[test]
fn gguf_errors_are_clear() {
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", Value::String("ugm".into()));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        Value::Array(vec![Value::String("a".into())]),
    );
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
    assert!(err.contains("ugm"), "{err}");

    w.add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", Value::String("mystery".into()));
    w.add_metadata(
        "tokenizer.ggml.merges",
        Value::Array(vec![Value::String("a a".into())]),
    );
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
    assert!(err.contains("mystery"), "{err}");

    let empty = GgufFile::from_bytes(GgufWriter::new().to_bytes().unwrap()).unwrap();
    assert!(matches!(
        Tokenizer::from_gguf(&empty),
        Err(LlmError::Gguf(_))
    ));
}

#[test]
fn bpe_tiny_vocab_merges_by_rank() {
    // Byte-level BPE on a toy vocabulary: "Ġ" is the space byte. Merges by rank, lowest
    // first, ties leftmost; a word that cannot merge fully stays in pieces.
    let tokens = ["a", "b", "c", "Ġ", "ab", "bc", "Ġa", "Ġab", "<x>"];
    let mut types = vec![TokenType::Normal; tokens.len()];
    types[8] = TokenType::UserDefined;
    let tok = Tokenizer::from_parts(TokenizerParts {
        kind: TokenizerKind::Bpe,
        pre: Some("gpt2".into()),
        tokens: tokens.iter().map(|s| (*s).to_owned()).collect(),
        token_types: types,
        merges: ["b c", "a b", "Ġ a", "Ġa b"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        ..TokenizerParts::default()
    })
    .unwrap();
    // "abc": "b c" (rank 0) first, then "a"+"bc" has no merge.
    assert_eq!(tok.encode("abc", EncodeOptions::default()), vec![0, 5]);
    // " ab": "a b" (rank 1) then "Ġ ab" has no merge → [Ġ, ab].
    assert_eq!(tok.encode(" ab", EncodeOptions::default()), vec![3, 4]);
    // " a": "Ġ a" (rank 2).
    assert_eq!(tok.encode(" a", EncodeOptions::default()), vec![6]);
    // User-defined tokens are matched even without parse_special, and always rendered.
    assert_eq!(tok.encode("a<x>b", EncodeOptions::default()), vec![0, 8, 1]);
    assert_eq!(tok.decode(&[0, 8, 1], false).unwrap(), "a<x>b");
    assert!(!tok.add_bos());
}

/// llama.cpp's `test` tokenizer (its random test models): 5-byte chunks hashed modulo the
/// vocabulary size, special tokens still split out, ids rendered in hexadecimal.
#[test]
fn test_tokenizer_hashes_chunks_and_renders_hex() {
    let tokens: Vec<String> = (0..128).map(|i| format!("tok_{i}")).collect();
    let tok = Tokenizer::from_parts(TokenizerParts {
        kind: TokenizerKind::Test,
        tokens,
        ..TokenizerParts::default()
    })
    .unwrap();
    assert_eq!((tok.bos(), tok.eos(), tok.unk()), (None, None, None));
    assert!(!tok.add_bos());
    // "hello" "worl" "d!": h = h * 31 + byte, mod 128 (worked in Python).
    assert_eq!(
        tok.encode("hello world!", EncodeOptions::prompt()),
        [82, 50, 61]
    );
    // Chunks of bytes, not characters: "naïve" is 6 bytes.
    assert_eq!(tok.encode("naïve", EncodeOptions::default()), [23, 101]);
    assert_eq!(tok.decode(&[82, 50, 61, 10], false).unwrap(), "52323da");
    assert_eq!(
        TokenizerKind::from_name("test").unwrap(),
        TokenizerKind::Test
    );
}
