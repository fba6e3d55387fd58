//! Jinja chat templates against llama.cpp: every template of the reference llama.cpp's
//! `models/templates/` rendered with `ChatTemplate` must equal llama.cpp's own `--jinja`
//! rendering byte for byte (fixtures from `scripts/gen_template_fixtures.py`), except the
//! templates in `SKIP`, each with the reason.

mod common;

use rgml_llm::chat_template::{value_from_json, ChatTemplate, ChatTemplateInputs, TemplateValue};
use std::path::PathBuf;

/// Templates whose rendering differs from llama.cpp's, and why: none now (the last two
/// added `'text' + undefined`, which `chat_template::concat` renders as llama.cpp does, and
/// Command R+'s tool calls needed Python's `indent`). The test fails when a template listed
/// here starts to match.
const SKIP: &[(&str, &str)] = &[];

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates")
}

fn get(value: &TemplateValue, key: &str) -> TemplateValue {
    value
        .get_attr(key)
        .unwrap_or_else(|e| panic!("fixture lacks {key}: {e}"))
}

fn text(value: &TemplateValue) -> String {
    value.as_str().map(String::from).unwrap_or_default()
}

fn inputs(fixture: &TemplateValue, conversation: &TemplateValue) -> ChatTemplateInputs {
    let tools = get(conversation, "tools");
    ChatTemplateInputs {
        messages: get(conversation, "messages"),
        tools: (!tools.is_undefined()).then_some(tools),
        add_generation_prompt: get(fixture, "add_generation_prompt").is_true(),
        enable_thinking: get(fixture, "enable_thinking").is_true(),
        // llama-server passes `chat_template_kwargs` on as template variables.
        extra: vec![("enable_thinking".into(), get(fixture, "enable_thinking"))],
        now: get(fixture, "now").as_i64(),
    }
}

/// The cases of one template where rendering differs from llama.cpp's: (case, why).
fn differences(fixture: &TemplateValue, name: &str, cases: &TemplateValue) -> Vec<String> {
    let source = std::fs::read_to_string(fixtures_dir().join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let template = match ChatTemplate::new(
        &source,
        &text(&get(fixture, "bos_token")),
        &text(&get(fixture, "eos_token")),
    ) {
        Ok(t) => t,
        Err(e) => return vec![format!("compile: {e}")],
    };
    let mut out = Vec::new();
    for case in cases.try_iter().expect("cases map") {
        let expected = get(&get(cases, case.as_str().unwrap_or_default()), "prompt");
        if expected.is_undefined() {
            continue; // llama.cpp refused this conversation
        }
        let conversation = get(
            &get(fixture, "conversations"),
            case.as_str().unwrap_or_default(),
        );
        match template.render(&inputs(fixture, &conversation)) {
            Ok(got) if got == text(&expected) => {}
            Ok(got) => out.push(format!(
                "{case}: differs\n--- llama.cpp\n{}\n--- rgml\n{got}",
                text(&expected)
            )),
            Err(e) => out.push(format!("{case}: {e}")),
        }
    }
    out
}

#[test]
fn templates_render_as_llama_cpp_does() {
    let json = std::fs::read_to_string(fixtures_dir().join("llamacpp.json")).expect("fixture");
    let fixture = value_from_json(&json).expect("fixture JSON");
    let templates = get(&fixture, "templates");
    let (mut total, mut equal, mut failures) = (0, 0, Vec::new());
    for name in templates.try_iter().expect("templates map") {
        let name = name.as_str().unwrap_or_default().to_string();
        let cases = get(&get(&templates, &name), "cases");
        if cases.is_undefined() {
            continue; // llama.cpp refused the template
        }
        total += 1;
        let diffs = differences(&fixture, &name, &cases);
        let skipped = SKIP.iter().any(|(n, _)| *n == name);
        match (diffs.is_empty(), skipped) {
            (true, true) => failures.push(format!("{name} renders as llama.cpp does: unskip it")),
            (true, false) => equal += 1,
            (false, true) => eprintln!("skipped {name}: {}", diffs[0].lines().next().unwrap_or("")),
            (false, false) => failures.push(format!("{name}: {}", diffs.join("\n"))),
        }
    }
    eprintln!(
        "{equal} of {total} templates render as llama.cpp does; {} skipped",
        SKIP.len()
    );
    assert!(
        failures.is_empty(),
        "{} templates differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The demo model: without `--jinja` the marker format (ChatML, the existing fixtures'
/// prompts); with it the file's template, which equals ChatML once a system message is given
/// (without one the template adds its default system message).
#[test]
fn demo_model_formats() {
    use rgml_llm::chat::{ChatFormat, ChatFormatter, Message};
    let model = common::demo_model();
    let markers = ChatFormatter::for_model(&model, None, false);
    assert!(
        matches!(markers, ChatFormatter::Markers(ChatFormat::ChatMl)),
        "{markers:?}"
    );
    let jinja = ChatFormatter::for_model(&model, None, true);
    assert!(matches!(jinja, ChatFormatter::Template { .. }), "{jinja:?}");
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "What is the boiling point of water?"),
        Message::new("assistant", "100 °C."),
        Message::new("user", "And of ethanol?"),
    ];
    for n in [2, 4] {
        let text = jinja.apply(&messages[..n]).expect("renders");
        assert_eq!(
            text,
            ChatFormat::ChatMl.apply(&messages[..n]),
            "{n} messages"
        );
    }
    let user_only = jinja.apply(&messages[1..2]).expect("renders");
    assert!(user_only.starts_with("<|im_start|>system\n"), "{user_only}");
}

/// The tool-call conversation built as [`Message`]s (what `rgml serve` hands the template:
/// tool calls, a tool result, and the tools as JSON) renders as llama.cpp renders it, for every
/// template that renders the JSON conversation alike, and the tool-call format each template
/// teaches is the one its markers show.
///
/// [`Message`]: rgml_llm::chat::Message
#[test]
fn tool_conversations_from_messages_render_as_llama_cpp_does() {
    use rgml_llm::chat::{Message, ToolCall};
    use rgml_llm::tool_calls::ToolCallFormat;
    let json = std::fs::read_to_string(fixtures_dir().join("llamacpp.json")).expect("fixture");
    let fixture = value_from_json(&json).expect("fixture JSON");
    let tools = get(&get(&get(&fixture, "conversations"), "tool_call"), "tools");
    let messages = [
        Message::new("user", "Weather in Paris?"),
        Message {
            tool_calls: vec![ToolCall {
                id: Some("call_1".into()),
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris"}"#.into(),
            }],
            ..Message::new("assistant", "")
        },
        Message {
            tool_call_id: Some("call_1".into()),
            ..Message::new("tool", r#"{"temp": 21}"#)
        },
        Message::new("user", "Thanks!"),
    ];
    let templates = get(&fixture, "templates");
    let (mut checked, mut failures) = (0, Vec::new());
    for name in templates.try_iter().expect("templates map") {
        let name = name.as_str().unwrap_or_default().to_string();
        let expected = get(&get(&get(&templates, &name), "cases"), "tool_call");
        let expected = text(&get(&expected, "prompt"));
        if expected.is_empty() || SKIP.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let source = std::fs::read_to_string(fixtures_dir().join(&name)).expect("template");
        let Ok(template) = ChatTemplate::new(
            &source,
            &text(&get(&fixture, "bos_token")),
            &text(&get(&fixture, "eos_token")),
        ) else {
            continue;
        };
        let mut inputs = ChatTemplateInputs::from_messages(&messages);
        inputs.tools = Some(tools.clone());
        inputs.add_generation_prompt = get(&fixture, "add_generation_prompt").is_true();
        inputs.enable_thinking = get(&fixture, "enable_thinking").is_true();
        inputs.extra = vec![("enable_thinking".into(), get(&fixture, "enable_thinking"))];
        inputs.now = get(&fixture, "now").as_i64();
        checked += 1;
        match template.render(&inputs) {
            Ok(got) if got == expected => {}
            Ok(got) => failures.push(format!("{name}: differs\n{expected}\n---\n{got}")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(checked > 40, "only {checked} templates checked");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let format = |name: &str| {
        let source = std::fs::read_to_string(fixtures_dir().join(name)).expect("template");
        ToolCallFormat::detect(&source)
    };
    assert_eq!(
        format("Qwen-Qwen2.5-7B-Instruct.jinja"),
        Some(ToolCallFormat::Hermes)
    );
    assert_eq!(
        format("Qwen-Qwen3-0.6B.jinja"),
        Some(ToolCallFormat::Hermes)
    );
}
