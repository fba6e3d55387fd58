//! The engine on the demo model: requests decoded together give their solo greedy output
//! (`Session::generate`, what `rgml run --temp 0` prints), queue when every slot is busy, free
//! their slot when cancelled, reuse cached prefixes, stop at stop strings, and bad requests are
//! refused before they start.

use rgml_llm::chat::{ChatFormat, Message};
use rgml_llm::embed::Pooling;
use rgml_llm::tool_calls::ToolCallFormat;
use rgml_llm::{EncodeOptions, Model, Sampler, SamplerParams, Session, SessionOptions};
use rgml_serve::engine::{Engine, EngineOptions, PrefixReuse};
use rgml_serve::generator::{FinishReason, GenEvent, Usage};
use rgml_serve::{GenRequest, Generator, Prompt, Submission, SubmitError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const N_CTX: usize = 256;

fn model() -> Arc<Model> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "run scripts/fetch-model.sh first");
    rgml_cpu::register();
    Arc::new(Model::load(path, Default::default()).unwrap())
}

fn engine(model: &Arc<Model>, n_slots: usize, max_batch: usize) -> Engine {
    engine_ub(model, n_slots, max_batch, 512)
}

/// An engine whose session evaluates prompts in pieces of `n_ubatch`.
fn engine_ub(model: &Arc<Model>, n_slots: usize, max_batch: usize, n_ubatch: usize) -> Engine {
    let session = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: N_CTX,
            n_ubatch,
            n_threads: Some(2),
            n_seq: n_slots,
            ..Default::default()
        },
    )
    .unwrap();
    Engine::start(
        session,
        EngineOptions {
            model_id: "demo".into(),
            max_batch,
            // The marker format (ChatML), as the solo runs these tests compare with render.
            jinja: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn greedy(prompt: Prompt, max_tokens: usize) -> GenRequest {
    GenRequest {
        prompt,
        sampling: SamplerParams::greedy(),
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        n_probs: None,
        ignore_eos: false,
        format: Default::default(),
    }
}

/// What `rgml run --temp 0` prints for `text` (with `chat`: as the user's message).
fn solo(model: &Arc<Model>, text: &str, chat: bool, max_tokens: usize) -> String {
    solo_ub(model, text, chat, max_tokens, 512)
}

/// [`solo`] with prompts evaluated in pieces of `n_ubatch` (`rgml run --ubatch`).
fn solo_ub(
    model: &Arc<Model>,
    text: &str,
    chat: bool,
    max_tokens: usize,
    n_ubatch: usize,
) -> String {
    let prompt = match chat {
        true => ChatFormat::for_model(model.config.kind, model.chat_template())
            .apply(&[Message::new("user", text)]),
        false => text.to_string(),
    };
    let tokens = model.tokenizer.encode(&prompt, EncodeOptions::prompt());
    let mut s = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: N_CTX,
            n_ubatch,
            n_threads: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let mut sampler = Sampler::new(SamplerParams::greedy());
    let mut decoder = model.tokenizer.decoder(false);
    let mut out = String::new();
    for t in s.generate(&tokens, &mut sampler, max_tokens).unwrap() {
        out += &decoder.push(t.unwrap()).unwrap();
    }
    out + &decoder.finish()
}

/// The whole text of a submission, its finish reason and usage.
fn collect(mut sub: Submission) -> (String, FinishReason, Usage) {
    let mut text = String::new();
    while let Some(ev) = sub.events.blocking_recv() {
        match ev {
            GenEvent::Token(t) => text += &t.text,
            GenEvent::Done {
                text: rest,
                reason,
                usage,
            } => return (text + &rest, reason, usage),
            GenEvent::Failed(why) => panic!("failed: {why}"),
        }
    }
    panic!("the events ended without Done");
}

const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The capital of France is",
    "def add(a, b):",
    "The quick brown fox",
    "In 1492, Columbus",
    "Water boils at",
    "My favourite colour is",
    "Rust is a programming language that",
];

#[test]
fn concurrent_requests_give_their_solo_output() {
    let model = model();
    // 4 slots for 8 requests: half of them queue; prompts join the running batch.
    let e = engine(&model, 4, 512);
    let subs: Vec<Submission> = PROMPTS
        .iter()
        .map(|p| e.submit(greedy(Prompt::Text(p.to_string()), 24)).unwrap())
        .collect();
    let mut n_generated = 0;
    for (p, sub) in PROMPTS.iter().zip(subs) {
        let (text, reason, usage) = collect(sub);
        assert_eq!(text, solo(&model, p, false, 24), "prompt {p:?}");
        // 24 tokens, or fewer ended by the end-of-generation token.
        let full = usage.completion_tokens == 24;
        assert_eq!(
            reason,
            [FinishReason::Stop, FinishReason::Length][usize::from(full)]
        );
        n_generated += usage.completion_tokens as u64;
    }
    let stats = e.stats();
    assert_eq!(stats.requests_total, 8);
    assert_eq!(stats.requests_finished, 8);
    assert_eq!(stats.generated_tokens_total, n_generated);
}

/// A chat's next turn keeps the whole micro-batch pieces of the earlier prompt that it shares,
/// and evaluates the rest in the pieces a fresh request would: the same output as `rgml run
/// --chat --ubatch 8`, bit for bit.
#[test]
fn chat_requests_give_run_chat_output_and_reuse_the_cached_prefix() {
    let model = model();
    let ub = 8;
    // A step budget of 16 tokens: prompts take several steps.
    let e = engine_ub(&model, 2, 16, ub);
    let ask = |text: &str| {
        let req = greedy(Prompt::Chat(vec![Message::new("user", text)]), 32);
        collect(e.submit(req).unwrap())
    };
    let (q1, q2) = (
        "What is the capital of France?",
        "What is the capital of France? Answer in one word.",
    );
    let (first, _, usage) = ask(q1);
    assert_eq!(first, solo_ub(&model, q1, true, 32, ub));
    assert_eq!(usage.cached_tokens, 0);
    let (second, _, usage) = ask(q2);
    assert_eq!(second, solo_ub(&model, q2, true, 32, ub));
    let tokens = |text: &str| {
        let prompt = ChatFormat::for_model(model.config.kind, model.chat_template())
            .apply(&[Message::new("user", text)]);
        model.tokenizer.encode(&prompt, EncodeOptions::prompt())
    };
    let (a, b) = (tokens(q1), tokens(q2));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(common >= ub);
    assert_eq!(usage.cached_tokens, common / ub * ub);
}

/// A request whose prompt a slot holds whole (the same prompt again) evaluates nothing: it
/// starts from the kept logits, with the same output; a longer prompt after a cut one, and a
/// prompt after another, are evaluated as usual.
#[test]
fn the_same_prompt_again_starts_from_its_kept_logits() {
    let model = model();
    let e = engine(&model, 1, 64);
    let text = "The quick brown fox";
    let n = model.tokenizer.encode(text, EncodeOptions::prompt()).len();
    let want = solo(&model, text, false, 12);
    for round in 0..3 {
        let (got, _, usage) = collect(e.submit(greedy(Prompt::Text(text.into()), 12)).unwrap());
        assert_eq!(got, want, "round {round}");
        assert_eq!(usage.cached_tokens, if round == 0 { 0 } else { n });
    }
    // Another prompt, then the first again: evaluated (the cache holds the other one).
    let other = "Water boils at";
    let (got, _, usage) = collect(e.submit(greedy(Prompt::Text(other.into()), 12)).unwrap());
    assert_eq!(
        (got, usage.cached_tokens),
        (solo(&model, other, false, 12), 0)
    );
    let (got, _, usage) = collect(e.submit(greedy(Prompt::Text(text.into()), 12)).unwrap());
    assert_eq!((got, usage.cached_tokens), (want, 0));
}

/// A prompt another slot holds whole, while that slot still generates, is copied from it
/// with its logits: evaluated nowhere again, the same output as alone.
#[test]
fn a_prompt_held_by_a_busy_slot_is_copied_with_its_logits() {
    let model = model();
    let e = engine(&model, 2, 64);
    let text = "Rust is a programming language that";
    let n = model.tokenizer.encode(text, EncodeOptions::prompt()).len();
    let mut long = e.submit(greedy(Prompt::Text(text.into()), 48)).unwrap();
    // Its first token: the prompt is evaluated and its logits kept.
    assert!(matches!(
        long.events.blocking_recv(),
        Some(GenEvent::Token(_))
    ));
    let (got, _, usage) = collect(e.submit(greedy(Prompt::Text(text.into()), 12)).unwrap());
    assert_eq!(got, solo(&model, text, false, 12));
    assert_eq!(usage.cached_tokens, n);
    drop(long);
}

/// With any prefix reused, the next turn evaluates only what is new.
#[test]
fn any_prefix_reuse_keeps_the_whole_common_prefix() {
    let model = model();
    let session = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: N_CTX,
            n_threads: Some(2),
            n_seq: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let options = EngineOptions {
        prefix_reuse: PrefixReuse::Any,
        ..Default::default()
    };
    let e = Engine::start(session, options).unwrap();
    let first = Prompt::Text("The quick brown fox jumps over the lazy dog. It".into());
    let (_, _, usage) = collect(e.submit(greedy(first, 8)).unwrap());
    assert_eq!(usage.cached_tokens, 0);
    let second = Prompt::Text("The quick brown fox jumps over the lazy dog. Then".into());
    let (text, _, usage) = collect(e.submit(greedy(second, 8)).unwrap());
    assert!(!text.is_empty());
    let n = model.tokenizer.encode(
        "The quick brown fox jumps over the lazy dog.",
        EncodeOptions::prompt(),
    );
    assert_eq!(usage.cached_tokens, n.len());
}

#[test]
fn a_cancelled_request_frees_its_slot() {
    let model = model();
    let e = engine(&model, 1, 512);
    let long = e
        .submit(greedy(Prompt::Text("Once upon a time".into()), 200))
        .unwrap();
    let waiting = e
        .submit(greedy(Prompt::Text("Water boils at".into()), 8))
        .unwrap();
    let mut long = long;
    // The first token comes, then the client goes away.
    assert!(matches!(
        long.events.blocking_recv(),
        Some(GenEvent::Token(_))
    ));
    let t0 = Instant::now();
    drop(long);
    let (text, _, _) = collect(waiting);
    assert_eq!(text, solo(&model, "Water boils at", false, 8));
    assert!(t0.elapsed() < Duration::from_secs(20));
    let stats = e.stats();
    assert_eq!(stats.requests_cancelled, 1);
    assert!(stats.generated_tokens_total < 100, "{stats:?}");
    assert_eq!(stats.slots_busy, 0);
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let model = model();
    let e = engine(&model, 1, 512);
    let full = solo(&model, "Once upon a time", false, 32);
    // A stop string from the middle of the greedy text.
    let words: Vec<&str> = full.split_whitespace().collect();
    let stop = format!("{} {}", words[3], words[4]);
    let at = full.find(&stop).unwrap();
    let mut req = greedy(Prompt::Text("Once upon a time".into()), 32);
    req.stop = vec!["never appears in this text".into(), stop];
    let (text, reason, _) = collect(e.submit(req).unwrap());
    assert_eq!(text, full[..at]);
    assert_eq!(reason, FinishReason::Stop);
}

#[test]
fn logprobs_are_the_softmax_of_the_logits() {
    let model = model();
    let e = engine(&model, 1, 512);
    let mut req = greedy(Prompt::Text("The capital of France is".into()), 4);
    req.n_probs = Some(5);
    let mut sub = e.submit(req).unwrap();
    let mut n = 0;
    while let Some(GenEvent::Token(t)) = sub.events.blocking_recv() {
        let lp = t.logprobs.unwrap();
        assert_eq!(lp.top.len(), 5);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp.chosen.id, t.id);
        assert_eq!(lp.top[0].id, t.id);
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        let total: f32 = lp.top.iter().map(|x| x.logprob.exp()).sum();
        assert!(lp.top[0].logprob <= 0.0 && total <= 1.0001, "{total}");
        n += 1;
    }
    assert_eq!(n, 4);
}

/// `ignore_eos`: a request that would end at an end-of-generation token runs to max_tokens.
#[test]
fn ignore_eos_runs_to_max_tokens() {
    let model = model();
    let e = engine(&model, 1, 512);
    let chat = || Prompt::Chat(vec![Message::new("user", "What is the capital of France?")]);
    let (short, reason, usage) = collect(e.submit(greedy(chat(), 40)).unwrap());
    assert_eq!(reason, FinishReason::Stop);
    assert!(usage.completion_tokens < 40);
    let mut req = greedy(chat(), 40);
    req.ignore_eos = true;
    let (long, reason, usage) = collect(e.submit(req).unwrap());
    assert_eq!(
        (reason, usage.completion_tokens),
        (FinishReason::Length, 40)
    );
    assert!(long.starts_with(&short), "{long:?} / {short:?}");
}

/// A banned token (`logit_bias` of -inf) never comes: greedy decoding takes the next best, and
/// the text differs from the unbiased one from that token on.
#[test]
fn logit_bias_bans_a_token() {
    let model = model();
    let e = engine(&model, 1, 512);
    let prompt = || Prompt::Text("The capital of France is".into());
    let ids = |mut sub: Submission| {
        let mut ids = Vec::new();
        while let Some(event) = sub.events.blocking_recv() {
            if let GenEvent::Token(token) = event {
                ids.push(token.id);
            }
        }
        ids
    };
    let first = ids(e.submit(greedy(prompt(), 6)).unwrap())[0];
    let mut banned = greedy(prompt(), 6);
    banned.sampling.logit_bias = vec![(first, f32::NEG_INFINITY)];
    let tokens = ids(e.submit(banned).unwrap());
    assert!(!tokens.is_empty());
    assert!(!tokens.contains(&first), "{first} in {tokens:?}");
    e.shutdown();
}

/// Tools reach the model only through a Jinja template that shows a tool-call format: with the
/// marker format the engine reads no calls and refuses tool conversations; with Qwen 2.5's
/// template (Hermes `<tool_call>`) the request runs, its prompt holding the tools.
#[test]
fn tools_need_a_template_that_shows_tool_calls() {
    let model = model();
    let markers = engine(&model, 1, 512);
    assert_eq!(markers.tool_call_format(), None);
    let tools = r#"[{"type": "function", "function": {"name": "weather", "parameters": {}}}]"#;
    let ask = || Prompt::ChatWithTools {
        messages: vec![Message::new("user", "Weather in Paris?")],
        tools: tools.to_string(),
    };
    assert!(matches!(
        markers.submit(greedy(ask(), 2)).err(),
        Some(SubmitError::ChatTemplate(_))
    ));
    markers.shutdown();
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rgml-llm/tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    let session = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: 1024,
            n_threads: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let qwen = Engine::start(
        session,
        EngineOptions {
            model_id: "demo".into(),
            chat_template: Some(std::fs::read_to_string(&template).unwrap()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(qwen.tool_call_format(), Some(ToolCallFormat::Hermes));
    assert_eq!(
        qwen.chat_template(),
        Some(std::fs::read_to_string(&template).unwrap().as_str())
    );
    let plain = qwen
        .submit(greedy(
            Prompt::Chat(vec![Message::new("user", "Weather in Paris?")]),
            2,
        ))
        .unwrap();
    let with_tools = qwen.submit(greedy(ask(), 2)).unwrap();
    assert!(
        with_tools.prompt_tokens > plain.prompt_tokens + 20,
        "{} vs {}: the tools are not in the prompt",
        with_tools.prompt_tokens,
        plain.prompt_tokens
    );
    collect(plain);
    collect(with_tools);
    // A forced call of `weather` (tool_choice naming it): the answer is that call, its
    // arguments a JSON object, read back as one call.
    let format = ToolCallFormat::Hermes;
    let mut whole = 0;
    // Sampled (greedy decoding of this tiny model writes arguments past any limit), until one
    // call ends.
    for seed in 6..10 {
        let (prefix, suffix) = format.forced_frame("weather");
        let frame = rgml_llm::grammar::schema::Framed {
            prefix: &prefix,
            schema: None,
            suffix: &suffix,
        };
        let (gbnf, _) = rgml_llm::grammar::schema::framed_to_gbnf(&[frame]).unwrap();
        let grammar = rgml_llm::grammar::Grammar::from_gbnf(&gbnf).unwrap();
        let mut req = greedy(ask(), 300);
        req.format = rgml_serve::generator::OutputFormat::Grammar(Arc::new(grammar));
        req.sampling = SamplerParams {
            seed,
            ..SamplerParams::default()
        };
        let (text, reason, _) = collect(qwen.submit(req).unwrap());
        if reason == FinishReason::Length {
            continue;
        }
        let calls = format.parse(&text).tool_calls;
        assert_eq!(calls.len(), 1, "{text}");
        assert_eq!(calls[0].name, "weather");
        let args: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert!(args.is_object(), "{text}");
        whole += 1;
        break;
    }
    assert!(whole >= 1, "no forced call ended within 300 tokens");
    qwen.shutdown();
}

/// A JSON answer (`response_format` `json_object`) is one JSON object, greedy or sampled: it
/// parses, and the answer ends with it (one cut short by `max_tokens` is a prefix of one).
#[test]
fn json_answers_are_json_objects() {
    let model = model();
    let e = engine(&model, 1, 512);
    let ask = || {
        Prompt::Chat(vec![Message::new(
            "user",
            "Give a JSON object with the name and colour of a cat.",
        )])
    };
    let mut whole = 0;
    for seed in [None, Some(1), Some(2), Some(3)] {
        let mut req = greedy(ask(), 200);
        req.format = rgml_serve::generator::OutputFormat::JsonObject;
        if let Some(seed) = seed {
            req.sampling = SamplerParams {
                seed,
                temp: 0.8,
                ..SamplerParams::default()
            };
        }
        let (text, reason, _) = collect(e.submit(req).unwrap());
        if reason == FinishReason::Length {
            let mut prefix =
                rgml_llm::grammar::Matcher::new(rgml_llm::grammar::Grammar::json_object());
            assert!(prefix.push(text.as_bytes()), "{text}");
            continue;
        }
        assert_eq!(reason, FinishReason::Stop, "{text}");
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(value.is_object(), "{text}");
        whole += 1;
    }
    assert!(whole >= 2, "only {whole} answers ended");
    e.shutdown();
}

/// A JSON-schema answer (`response_format` `json_schema`) parses and validates against the
/// schema, greedy and over 20 seeds; a GBNF grammar's answer is one of its sentences, and the
/// answer ends where the grammar allows nothing more.
#[test]
fn grammar_answers_follow_their_grammar() {
    let model = model();
    let e = engine(&model, 2, 512);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 1, "maximum": 30},
            "colour": {"enum": ["black", "white", "ginger"]},
            "toys": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        },
        "required": ["name", "age", "colour"],
        "additionalProperties": false,
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let grammar = Arc::new(rgml_llm::grammar::Grammar::from_json_schema(&schema).unwrap());
    let ask = || {
        Prompt::Chat(vec![Message::new(
            "user",
            "Describe a cat as JSON with its name, age, colour and toys.",
        )])
    };
    let mut whole = 0;
    for seed in (0..=20).map(|s| (s > 0).then_some(s)) {
        let mut req = greedy(ask(), 120);
        req.format = rgml_serve::generator::OutputFormat::Grammar(grammar.clone());
        if let Some(seed) = seed {
            req.sampling = SamplerParams {
                seed,
                temp: 1.0,
                ..SamplerParams::default()
            };
        }
        let (text, reason, _) = collect(e.submit(req).unwrap());
        let mut matcher = rgml_llm::grammar::Matcher::new(grammar.clone());
        assert!(matcher.push(text.as_bytes()), "{text}");
        if reason == FinishReason::Length {
            continue;
        }
        assert_eq!(reason, FinishReason::Stop, "{text}");
        assert!(matcher.complete(), "{text}");
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(validator.is_valid(&value), "{text}");
        whole += 1;
    }
    assert!(whole >= 15, "only {whole} of 21 answers ended");

    let gbnf = "root ::= (\"yes\" | \"no\") \", because \" [a-z ]{3,20} \".\"";
    let grammar = Arc::new(rgml_llm::grammar::Grammar::from_gbnf(gbnf).unwrap());
    for seed in [None, Some(7)] {
        let mut req = greedy(Prompt::Text("Is the sky blue? Answer:".into()), 60);
        req.format = rgml_serve::generator::OutputFormat::Grammar(grammar.clone());
        if let Some(seed) = seed {
            req.sampling = SamplerParams {
                seed,
                temp: 0.9,
                ..SamplerParams::default()
            };
        }
        let (text, reason, _) = collect(e.submit(req).unwrap());
        assert_eq!(reason, FinishReason::Stop, "{text}");
        let mut matcher = rgml_llm::grammar::Matcher::new(grammar.clone());
        assert!(
            matcher.push(text.as_bytes()) && matcher.finished(),
            "{text}"
        );
    }
    e.shutdown();
}

#[test]
fn a_grammar_too_ambiguous_to_follow_fails_the_request_by_name() {
    let model = model();
    let e = engine(&model, 1, 512);
    // Only a's may come before the 20th, and after n of them 2^n stacks are open.
    let gbnf = "root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"a\"{20}";
    let grammar = Arc::new(rgml_llm::grammar::Grammar::from_gbnf(gbnf).unwrap());
    let mut req = greedy(Prompt::Text("Say a:".into()), 60);
    req.format = rgml_serve::generator::OutputFormat::Grammar(grammar);
    let mut sub = e.submit(req).unwrap();
    let mut text = String::new();
    let why = loop {
        match sub.events.blocking_recv() {
            Some(GenEvent::Token(t)) => text += &t.text,
            Some(GenEvent::Failed(why)) => break why,
            other => panic!("{other:?} after {text:?}"),
        }
    };
    assert!(why.contains("too ambiguous"), "{why}");
    assert!(text.chars().all(|c| c == 'a') && text.len() < 20, "{text}");
    // The engine goes on serving.
    let (_, reason, _) = collect(e.submit(greedy(Prompt::Text("Hi".into()), 4)).unwrap());
    assert_eq!(reason, FinishReason::Length);
    e.shutdown();
}

#[test]
fn bad_requests_are_refused() {
    let model = model();
    let e = engine(&model, 1, 512);
    let long = "word ".repeat(400);
    assert!(matches!(
        e.submit(greedy(Prompt::Text(long), 4)).err(),
        Some(SubmitError::PromptTooLong { .. })
    ));
    assert!(matches!(
        e.submit(greedy(Prompt::Text("hi".into()), N_CTX + 1)).err(),
        Some(SubmitError::MaxTokensTooLarge { .. })
    ));
    assert!(matches!(
        e.submit(greedy(Prompt::Tokens(vec![1, 999_999]), 4)).err(),
        Some(SubmitError::InvalidToken { .. })
    ));
    assert!(matches!(
        e.submit(greedy(Prompt::Tokens(vec![]), 4)).err(),
        Some(SubmitError::EmptyPrompt)
    ));
    let mut req = greedy(Prompt::Text("hi".into()), 4);
    req.sampling.logit_bias = vec![(1, 1.0), (999_999, -1.0)];
    assert!(matches!(
        e.submit(req).err(),
        Some(SubmitError::InvalidBiasToken { id: 999_999, .. })
    ));
    let mut req = greedy(Prompt::Text("hi".into()), 4);
    req.sampling.top_p = 2.0;
    assert!(matches!(
        e.submit(req).err(),
        Some(SubmitError::InvalidSampling { name: "top_p", .. })
    ));
    assert!(e.healthy());
    e.shutdown();
    assert!(matches!(
        e.submit(greedy(Prompt::Text("hi".into()), 4)).err(),
        Some(SubmitError::ShuttingDown)
    ));
}

#[test]
fn shutdown_ends_running_requests() {
    let model = model();
    let e = engine(&model, 1, 512);
    let mut running = e
        .submit(greedy(Prompt::Text("Once upon a time".into()), 200))
        .unwrap();
    let queued = e
        .submit(greedy(Prompt::Text("Water boils at".into()), 8))
        .unwrap();
    assert!(matches!(
        running.events.blocking_recv(),
        Some(GenEvent::Token(_))
    ));
    e.shutdown();
    let mut reason = None;
    while let Some(ev) = running.events.blocking_recv() {
        if let GenEvent::Done { reason: r, .. } = ev {
            reason = Some(r);
        }
    }
    assert_eq!(reason, Some(FinishReason::Shutdown));
    let mut queued = queued;
    assert!(matches!(
        queued.events.blocking_recv(),
        Some(GenEvent::Failed(_))
    ));
    e.join();
}

/// `/v1/embeddings`' computation: each input pooled as asked (or by the last token, the demo
/// file saying nothing), normalised, equal to llama.cpp's (`rgml-cli`'s embedding fixture of
/// this CPU's arithmetic: last and CLS bit for bit, mean within an f32 rounding); bad inputs
/// refused before anything is computed.
#[test]
fn embeddings_are_llama_cpps() {
    let model = model();
    // The engine runs this CPU's arithmetic: AVX-512's where it has it.
    let isa = match rgml_cpu::CpuFeatures::detect().has_avx512() {
        true => "avx512",
        false => "avx2",
    };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../rgml-cli/tests/fixtures/embeddings/{isa}.json"));
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for pooling in [None, Some(Pooling::Mean), Some(Pooling::Cls)] {
        let session = Session::new(
            model.clone(),
            &SessionOptions {
                n_ctx: N_CTX,
                ..Default::default()
            },
        )
        .unwrap();
        let options = EngineOptions {
            model_id: "demo".into(),
            pooling,
            embedding_session: SessionOptions {
                n_threads: Some(2),
                flash_attn: rgml_llm::FlashAttn::Off,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = Engine::start(session, options).unwrap();
        let name = pooling.unwrap_or(Pooling::Last).name();
        let cases: Vec<&serde_json::Value> = fixture["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["pooling"] == name)
            .collect();
        let inputs: Vec<Vec<u32>> = cases
            .iter()
            .map(|c| serde_json::from_value(c["tokens"].clone()).unwrap())
            .collect();
        let got = e.embed(&inputs).unwrap().unwrap();
        for (case, v) in cases.iter().zip(&got) {
            let want: Vec<f32> = serde_json::from_value(case["embedding"].clone()).unwrap();
            let worst = v
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert_eq!(worst, 0.0, "{name}: from llama.cpp");
        }
        let n_vocab = model.config.n_vocab as u32;
        assert!(matches!(
            e.embed(&[vec![1, n_vocab]]),
            Some(Err(SubmitError::InvalidToken { .. }))
        ));
        assert!(matches!(
            e.embed(&[vec![]]),
            Some(Err(SubmitError::EmptyPrompt))
        ));
    }
}

/// Several inputs embedded together (one sequence each, in shared graphs) give each input's
/// vector alone, bit for bit, for the demo decoder (last and mean pooling) and a BERT encoder
/// (CLS and mean: every token's row, bidirectional attention within its own input only);
/// inputs of different lengths, more of them than one micro-batch holds.
#[test]
fn inputs_embedded_together_equal_each_alone() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let demo = model();
    let bert = {
        let vocab = root.join(rgml_testmodels::Arch::Bert.vocab_file());
        assert!(vocab.exists(), "run scripts/fetch-vocab.sh first");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-embed");
        std::fs::create_dir_all(&dir).expect("create the model directory");
        let path = dir.join("bert.gguf");
        rgml_testmodels::write_random_model(rgml_testmodels::Arch::Bert, &vocab, &path)
            .expect("write the random model");
        Arc::new(Model::load(&path, Default::default()).expect("load the model"))
    };
    let cases = [
        (demo.clone(), Pooling::Last),
        (demo, Pooling::Mean),
        (bert.clone(), Pooling::Cls),
        (bert, Pooling::Mean),
    ];
    for (model, pooling) in cases {
        let n_vocab = model.config.n_vocab as u32;
        // 9 inputs of 3 to 43 tokens (ids spread over the vocabulary), 16 tokens a graph.
        let inputs: Vec<Vec<u32>> = (0..9u32)
            .map(|i| {
                (0..3 + 5 * i)
                    .map(|j| 1 + (i * 7919 + j * 104_729) % (n_vocab - 1))
                    .collect()
            })
            .collect();
        // An encoder's serving session computes embeddings too (it has no output head).
        let serving = SessionOptions {
            embeddings: !model.config.causal,
            ..Default::default()
        };
        let session = Session::new(model.clone(), &serving).unwrap();
        let options = EngineOptions {
            model_id: "embed".into(),
            pooling: Some(pooling),
            embedding_session: SessionOptions {
                n_threads: Some(2),
                n_ubatch: 64,
                flash_attn: rgml_llm::FlashAttn::Off,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = Engine::start(session, options).unwrap();
        let together = e.embed(&inputs).unwrap().unwrap();
        assert_eq!(together.len(), inputs.len());
        for (input, v) in inputs.iter().zip(&together) {
            let alone = e.embed(std::slice::from_ref(input)).unwrap().unwrap();
            assert_eq!(v, &alone[0], "{pooling:?}: {} tokens", input.len());
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
        }
        // A session embeds at most as many inputs at once as it has sequences.
        let mut two = Session::new(
            model.clone(),
            &SessionOptions {
                n_seq: 2,
                embeddings: true,
                ..Default::default()
            },
        )
        .unwrap();
        let three: Vec<&[u32]> = inputs[..3].iter().map(Vec::as_slice).collect();
        let err = two.embed_batch(&three, pooling).unwrap_err().to_string();
        assert!(err.contains("3 inputs"), "{err}");
        assert_eq!(two.embed_batch(&three[..2], pooling).unwrap().len(), 2);
    }
}
