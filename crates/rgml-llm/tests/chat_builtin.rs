//! llama.cpp's built-in chat formats (`--no-jinja`, `--chat-template NAME`) against llama.cpp's
//! `llama_chat_apply_template` (`tests/fixtures/builtin/llamacpp.json`,
//! `scripts/gen_builtin_template_fixtures.py`): every name it lists, applied to a few
//! conversations with the assistant's turn opened, and its recognition of the format in every
//! template of `tests/fixtures/templates/` (or of none), byte for byte.

use rgml_llm::chat::{ChatFormat, Message};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture() -> Value {
    let text = std::fs::read_to_string(fixtures().join("builtin/llamacpp.json")).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

/// The fixture's conversations as messages.
fn conversations(fixture: &Value) -> Vec<(String, Vec<Message>)> {
    let all = fixture["conversations"].as_object().expect("conversations");
    all.iter()
        .map(|(name, turns)| {
            let messages = turns
                .as_array()
                .expect("turns")
                .iter()
                .map(|t| {
                    let field = |k: &str| t[k].as_str().expect("role and content").to_string();
                    Message::new(&field("role"), &field("content"))
                })
                .collect();
            (name.clone(), messages)
        })
        .collect()
}

#[test]
fn every_builtin_name_formats_as_llama_cpp_does() {
    let fixture = fixture();
    let builtin = fixture["builtin"].as_object().expect("builtin");
    assert_eq!(builtin.len(), ChatFormat::NAMES.len(), "llama.cpp's names");
    for (name, cases) in builtin {
        let format = ChatFormat::from_name(name).unwrap_or_else(|| panic!("no format {name}"));
        for (conversation, messages) in conversations(&fixture) {
            let want = cases[&conversation].as_str().expect("a prompt");
            assert_eq!(format.apply(&messages), want, "{name}, {conversation}");
        }
    }
}

#[test]
fn templates_are_recognised_as_llama_cpp_recognises_them() {
    let fixture = fixture();
    let detected = fixture["detected"].as_object().expect("detected");
    let mut recognised = 0;
    for (file, cases) in detected {
        let source = std::fs::read_to_string(fixtures().join("templates").join(file))
            .expect("template file");
        let format = ChatFormat::detect(&source);
        if cases["user"].is_null() {
            assert_eq!(format, None, "{file}: llama.cpp recognises no format");
            continue;
        }
        let format = format.unwrap_or_else(|| panic!("{file}: llama.cpp recognises a format"));
        recognised += 1;
        for (conversation, messages) in conversations(&fixture) {
            let want = cases[&conversation].as_str().expect("a prompt");
            assert_eq!(format.apply(&messages), want, "{file}, {conversation}");
        }
    }
    assert!(recognised > 40, "{recognised} templates recognised");
}
