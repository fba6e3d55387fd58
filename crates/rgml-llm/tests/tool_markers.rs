//! A tool-call format whose markers are control tokens (Mistral v11's `[TOOL_CALLS]` and
//! `[ARGS]`, as in Mistral's tekken vocabularies): a decoder that preserves them shows the
//! parser the calls (one that does not, loses them), and a forced call's grammar, whose frame
//! names the markers by text, lets the sampler pick the control tokens themselves.

use rgml_llm::grammar::schema::{framed_to_gbnf, Framed};
use rgml_llm::grammar::Grammar;
use rgml_llm::tokenizer::{TokenType, TokenizerKind, TokenizerParts};
use rgml_llm::tool_calls::ToolCallFormat;
use rgml_llm::{Constraint, Sampler, SamplerParams, TokenId, Tokenizer};
use std::sync::Arc;

/// A SentencePiece vocabulary with the v11 markers as control tokens, every byte, and a few
/// pieces; the ids of `[TOOL_CALLS]` and `[ARGS]`.
fn tokenizer() -> (Tokenizer, TokenId, TokenId) {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "[TOOL_CALLS]", "[ARGS]"]
        .map(String::from)
        .to_vec();
    let mut types = vec![
        TokenType::Unknown,
        TokenType::Control,
        TokenType::Control,
        TokenType::Control,
        TokenType::Control,
    ];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte);
    }
    for piece in [
        "get",
        "_weather",
        "{\"",
        "city",
        "\":",
        "\"Paris\"",
        "}",
        "▁Sure",
    ] {
        tokens.push(piece.to_string());
        types.push(TokenType::Normal);
    }
    let parts = TokenizerParts {
        kind: TokenizerKind::Spm,
        tokens,
        token_types: types,
        ..TokenizerParts::default()
    };
    (Tokenizer::from_parts(parts).expect("tokenizer"), 3, 4)
}

fn id(tok: &Tokenizer, text: &str) -> TokenId {
    tok.token_id(text).unwrap_or_else(|| panic!("{text}"))
}

#[test]
fn preserved_markers_show_the_calls() {
    let (tok, calls, args) = tokenizer();
    let format = ToolCallFormat::MistralV11;
    let preserved = tok.special_ids(format.markers());
    assert_eq!(
        preserved,
        [calls, args],
        "[CALL_ID] is not in this vocabulary"
    );
    let output = [
        id(&tok, "▁Sure"),
        calls,
        id(&tok, "get"),
        id(&tok, "_weather"),
        args,
        id(&tok, "{\""),
        id(&tok, "city"),
        id(&tok, "\":"),
        id(&tok, "\"Paris\""),
        id(&tok, "}"),
    ];
    let decode = |mut d: rgml_llm::tokenizer::Decoder<'_>| {
        let mut text: String = output.iter().map(|&t| d.push(t).unwrap()).collect();
        text.push_str(&d.finish());
        text
    };
    let text = decode(tok.decoder_preserving(preserved));
    // (SentencePiece drops the first token's space.)
    assert_eq!(
        text,
        "Sure[TOOL_CALLS]get_weather[ARGS]{\"city\":\"Paris\"}"
    );
    let parsed = format.parse(&text);
    assert_eq!(parsed.content, "Sure");
    assert_eq!(parsed.tool_calls.len(), 1);
    assert_eq!(parsed.tool_calls[0].name, "get_weather");
    assert_eq!(parsed.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    // Without them the markers vanish, and so does the call.
    let plain = decode(tok.decoder(false));
    assert!(format.parse(&plain).tool_calls.is_empty(), "{plain}");
}

#[test]
fn a_forced_call_takes_the_control_markers() {
    let (tok, calls, args) = tokenizer();
    let (prefix, suffix) = ToolCallFormat::MistralV11.forced_frame("get_weather");
    let frame = Framed {
        prefix: &prefix,
        schema: None,
        suffix: &suffix,
    };
    let (gbnf, _) = framed_to_gbnf(&[frame]).expect("the frame's grammar");
    let grammar = Arc::new(Grammar::from_gbnf(&gbnf).expect("a grammar"));
    let mut constraint = Constraint::grammar(grammar);
    let mut sampler = Sampler::new(SamplerParams {
        temp: 0.0,
        ..SamplerParams::default()
    });
    // The model prefers plain text; the frame wants `[TOOL_CALLS]` first, which the control
    // token writes (as does a `[` byte, spelling it out).
    let mut logits = vec![0.0f32; tok.n_vocab()];
    logits[id(&tok, "▁Sure") as usize] = 10.0;
    logits[calls as usize] = 5.0;
    let first = constraint.sample(&mut sampler, &mut logits, &tok);
    assert_eq!(first, Some(calls));
    assert!(constraint.accept(calls, &tok));
    for piece in ["get", "_weather"] {
        assert!(constraint.accept(id(&tok, piece), &tok), "{piece}");
    }
    // `[ARGS]` as its control token, not spelled out.
    assert!(!constraint.accept(id(&tok, "}"), &tok));
    assert!(constraint.accept(args, &tok));
    assert!(constraint.accept(id(&tok, "{\""), &tok));
}

/// The vendored templates of the families with these formats are told apart by their markers.
#[test]
fn real_templates_name_their_formats() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect(name);
    for name in [
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
        "unsloth-mistral-Devstral-Small-2507.jinja",
    ] {
        let format = ToolCallFormat::detect(&read(name));
        assert_eq!(format, Some(ToolCallFormat::MistralV11), "{name}");
    }
    let nemo = read("mistralai-Mistral-Nemo-Instruct-2407.jinja");
    assert_eq!(
        ToolCallFormat::detect(&nemo),
        Some(ToolCallFormat::MistralNemo)
    );
    let gpt_oss = read("openai-gpt-oss-120b.jinja");
    assert_eq!(
        ToolCallFormat::detect(&gpt_oss),
        Some(ToolCallFormat::Harmony)
    );
    assert_eq!(
        rgml_llm::reasoning::Syntax::detect(&gpt_oss),
        Some(rgml_llm::reasoning::Syntax::Harmony)
    );
}
