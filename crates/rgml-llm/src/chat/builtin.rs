//! llama.cpp's built-in chat formats (`src/llama-chat.cpp`: `llm_chat_apply_template`), the
//! formatter of `--no-jinja` and of `--chat-template NAME`: each format by llama.cpp's name,
//! its heuristic recognition of a template text (`llm_chat_detect_template`), and the prompt
//! it writes for a conversation, byte for byte as llama.cpp writes it
//! (`tests/chat_builtin.rs` against `scripts/gen_builtin_template_fixtures.py`).

use crate::message::Message;

/// A built-in chat format (llama.cpp's `llm_chat_template`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // Each is named as llama.cpp names it (`NAMES`).
pub enum ChatFormat {
    ChatMl,
    Llama2,
    Llama2Sys,
    Llama2SysBos,
    Llama2SysStrip,
    MistralV1,
    MistralV3,
    MistralV3Tekken,
    MistralV7,
    MistralV7Tekken,
    Phi3,
    Phi4,
    Falcon3,
    Zephyr,
    Monarch,
    Gemma,
    Orion,
    OpenChat,
    Vicuna,
    VicunaOrca,
    Deepseek,
    Deepseek2,
    Deepseek3,
    DeepseekOcr,
    CommandR,
    Llama3,
    ChatGlm3,
    ChatGlm4,
    GlmEdge,
    MiniCpm,
    Exaone3,
    Exaone4,
    ExaoneMoe,
    RwkvWorld,
    Granite3,
    Granite40,
    Granite41,
    GigaChat,
    Megrez,
    Yandex,
    Bailing,
    BailingThink,
    Bailing2,
    Llama4,
    SmolVlm,
    /// dots.llm1 (recognised from a template; llama.cpp gives it no name).
    Dots1,
    HunyuanMoe,
    GptOss,
    HunyuanDense,
    HunyuanVl,
    KimiK2,
    SeedOss,
    Grok2,
    PanguEmbedded,
    SolarOpen,
}

impl ChatFormat {
    /// The formats by the names llama.cpp's `--chat-template` takes, in its order.
    pub const NAMES: &[(&str, ChatFormat)] = &[
        ("chatml", ChatFormat::ChatMl),
        ("llama2", ChatFormat::Llama2),
        ("llama2-sys", ChatFormat::Llama2Sys),
        ("llama2-sys-bos", ChatFormat::Llama2SysBos),
        ("llama2-sys-strip", ChatFormat::Llama2SysStrip),
        ("mistral-v1", ChatFormat::MistralV1),
        ("mistral-v3", ChatFormat::MistralV3),
        ("mistral-v3-tekken", ChatFormat::MistralV3Tekken),
        ("mistral-v7", ChatFormat::MistralV7),
        ("mistral-v7-tekken", ChatFormat::MistralV7Tekken),
        ("phi3", ChatFormat::Phi3),
        ("phi4", ChatFormat::Phi4),
        ("falcon3", ChatFormat::Falcon3),
        ("zephyr", ChatFormat::Zephyr),
        ("monarch", ChatFormat::Monarch),
        ("gemma", ChatFormat::Gemma),
        ("orion", ChatFormat::Orion),
        ("openchat", ChatFormat::OpenChat),
        ("vicuna", ChatFormat::Vicuna),
        ("vicuna-orca", ChatFormat::VicunaOrca),
        ("deepseek", ChatFormat::Deepseek),
        ("deepseek2", ChatFormat::Deepseek2),
        ("deepseek3", ChatFormat::Deepseek3),
        ("deepseek-ocr", ChatFormat::DeepseekOcr),
        ("command-r", ChatFormat::CommandR),
        ("llama3", ChatFormat::Llama3),
        ("chatglm3", ChatFormat::ChatGlm3),
        ("chatglm4", ChatFormat::ChatGlm4),
        ("glmedge", ChatFormat::GlmEdge),
        ("minicpm", ChatFormat::MiniCpm),
        ("exaone3", ChatFormat::Exaone3),
        ("exaone4", ChatFormat::Exaone4),
        ("exaone-moe", ChatFormat::ExaoneMoe),
        ("rwkv-world", ChatFormat::RwkvWorld),
        ("granite", ChatFormat::Granite3),
        ("granite-4.0", ChatFormat::Granite40),
        ("granite-4.1", ChatFormat::Granite41),
        ("gigachat", ChatFormat::GigaChat),
        ("megrez", ChatFormat::Megrez),
        ("yandex", ChatFormat::Yandex),
        ("bailing", ChatFormat::Bailing),
        ("bailing-think", ChatFormat::BailingThink),
        ("bailing2", ChatFormat::Bailing2),
        ("llama4", ChatFormat::Llama4),
        ("smolvlm", ChatFormat::SmolVlm),
        ("hunyuan-moe", ChatFormat::HunyuanMoe),
        ("gpt-oss", ChatFormat::GptOss),
        ("hunyuan-dense", ChatFormat::HunyuanDense),
        ("hunyuan-vl", ChatFormat::HunyuanVl),
        ("kimi-k2", ChatFormat::KimiK2),
        ("seed_oss", ChatFormat::SeedOss),
        ("grok-2", ChatFormat::Grok2),
        ("pangu-embedded", ChatFormat::PanguEmbedded),
        ("solar-open", ChatFormat::SolarOpen),
    ];

    /// The format llama.cpp calls `name`.
    pub fn from_name(name: &str) -> Option<ChatFormat> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, f)| f)
    }

    /// The format a template text (or a format's name) describes, by llama.cpp's heuristics;
    /// `None` where it recognises none.
    pub fn detect(template: &str) -> Option<ChatFormat> {
        use ChatFormat::*;
        if let Some(named) = Self::from_name(template) {
            return Some(named);
        }
        let has = |s: &str| template.contains(s);
        let format = if has("<|im_start|>") {
            match (has("<|im_sep|>"), has("<end_of_utterance>")) {
                (true, _) => Phi4,
                (false, true) => SmolVlm,
                _ => ChatMl,
            }
        } else if template.starts_with("mistral") || has("[INST]") {
            mistral_or_llama2(template)
        } else if has("<|assistant|>") && has("<|end|>") {
            Phi3
        } else if has("[gMASK]<sop>") {
            ChatGlm4
        } else if has("<|assistant|>") && has("<|user|>") {
            match (has("<|tool_declare|>"), has("</s>")) {
                (true, _) => ExaoneMoe,
                (false, true) => Falcon3,
                _ => GlmEdge,
            }
        } else if has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>") {
            GlmEdge
        } else if has("<|user|>") && has("<|endoftext|>") {
            Zephyr
        } else if has("bos_token + message['role']") {
            Monarch
        } else if has("<start_of_turn>") {
            Gemma
        } else if has("'\\n\\nAssistant: ' + eos_token") {
            Orion
        } else if has("GPT4 Correct ") {
            OpenChat
        } else if has("USER: ") && has("ASSISTANT: ") {
            if has("SYSTEM: ") {
                VicunaOrca
            } else {
                Vicuna
            }
        } else {
            return detect_more(template);
        };
        Some(format)
    }

    /// The format of a model of architecture `arch` with chat template `template`: the one
    /// the template describes, or without a template the architecture's own; ChatML where
    /// neither says (llama.cpp refuses such a template without `--jinja`).
    pub fn for_model(arch: crate::config::Arch, template: Option<&str>) -> ChatFormat {
        match (template, arch) {
            (None, crate::config::Arch::Gemma3) => ChatFormat::Gemma,
            (Some(t), _) => Self::detect(t).unwrap_or(ChatFormat::ChatMl),
            (None, _) => ChatFormat::ChatMl,
        }
    }

    /// The prompt for `messages`, with the assistant's turn opened where the format has a
    /// way to open it (llama.cpp's `add_ass`).
    pub fn apply(self, messages: &[Message]) -> String {
        use ChatFormat::*;
        let mut out = String::new();
        let turns: Vec<(&str, &str)> = messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        if let Some((open, mid, close, reply)) = self.tagged() {
            tagged(&mut out, &turns, (open, mid, close));
            out += reply;
            return out;
        }
        if let Some((parts, reply)) = self.by_role() {
            by_role(&mut out, &turns, parts);
            out += reply;
            return out;
        }
        match self {
            Llama3 => {
                for (role, content) in &turns {
                    out += &format!(
                        "<|start_header_id|>{role}<|end_header_id|>\n\n{}<|eot_id|>",
                        trim(content)
                    );
                }
                out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            }
            Llama4 => {
                for (role, content) in &turns {
                    out += &format!(
                        "<|header_start|>{role}<|header_end|>\n\n{}<|eot|>",
                        trim(content)
                    );
                }
                out += "<|header_start|>assistant<|header_end|>\n\n";
            }
            MistralV7 | MistralV7Tekken => mistral_v7(&mut out, &turns, self == MistralV7),
            MistralV1 | MistralV3 | MistralV3Tekken => mistral(&mut out, &turns, self),
            Llama2 | Llama2Sys | Llama2SysBos | Llama2SysStrip => llama2(&mut out, &turns, self),
            Gemma => gemma(&mut out, &turns),
            _ => apply_more(self, &mut out, &turns),
        }
        out
    }
}

impl ChatFormat {
    /// The formats that write every turn as `open role mid content close` and then open the
    /// assistant's with `reply`: those four texts.
    fn tagged(self) -> Option<(&'static str, &'static str, &'static str, &'static str)> {
        use ChatFormat::*;
        Some(match self {
            ChatMl => (
                "<|im_start|>",
                "\n",
                "<|im_end|>\n",
                "<|im_start|>assistant\n",
            ),
            Phi3 => ("<|", "|>\n", "<|end|>\n", "<|assistant|>\n"),
            Phi4 => (
                "<|im_start|>",
                "<|im_sep|>",
                "<|im_end|>",
                "<|im_start|>assistant<|im_sep|>",
            ),
            Falcon3 => ("<|", "|>\n", "\n", "<|assistant|>\n"),
            Zephyr => ("<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n"),
            GlmEdge => ("<|", "|>\n", "", "<|assistant|>"),
            Megrez => (
                "<|role_start|>",
                "<|role_end|>",
                "<|turn_end|>",
                "<|role_start|>assistant<|role_end|>",
            ),
            SolarOpen => ("<|begin|>", "<|content|>", "<|end|>", "<|begin|>assistant"),
            _ => return None,
        })
    }
}

/// A role's turn as `prefix content suffix`.
type RolePart = (&'static str, &'static str, &'static str);

impl ChatFormat {
    /// The formats that write the turns of some roles as `prefix content suffix` (leaving the
    /// others out) and then open the assistant's with `reply`: those parts and `reply`.
    fn by_role(self) -> Option<(&'static [RolePart], &'static str)> {
        use ChatFormat::*;
        const ASSISTANT: RolePart = ("assistant", "ASSISTANT: ", "</s>\n");
        Some(match self {
            Vicuna => (
                &[("system", "", "\n\n"), ("user", "USER: ", "\n"), ASSISTANT],
                "ASSISTANT:",
            ),
            VicunaOrca => (
                &[
                    ("system", "SYSTEM: ", "\n"),
                    ("user", "USER: ", "\n"),
                    ASSISTANT,
                ],
                "ASSISTANT:",
            ),
            Deepseek => (
                &[
                    ("system", "", ""),
                    ("user", "### Instruction:\n", "\n"),
                    ("assistant", "### Response:\n", "\n<|EOT|>\n"),
                ],
                "### Response:\n",
            ),
            Deepseek2 => (
                &[
                    ("system", "", "\n\n"),
                    ("user", "User: ", "\n\n"),
                    ("assistant", "Assistant: ", "<｜end▁of▁sentence｜>"),
                ],
                "Assistant:",
            ),
            Deepseek3 => (
                &[
                    ("system", "", "\n\n"),
                    ("user", "<｜User｜>", ""),
                    ("assistant", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
                ],
                "<｜Assistant｜>",
            ),
            _ => return None,
        })
    }
}

/// [`ChatFormat::detect`] past the first branches of llama.cpp's chain.
fn detect_more(template: &str) -> Option<ChatFormat> {
    use ChatFormat::*;
    let has = |s: &str| template.contains(s);
    let format = if has("### Instruction:") && has("<|EOT|>") {
        Deepseek
    } else if has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>") {
        CommandR
    } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
        Llama3
    } else if has("[gMASK]sop") {
        ChatGlm3
    } else if has("<用户>") {
        MiniCpm
    } else if has("'Assistant: ' + message['content'] + eos_token") {
        Deepseek2
    } else if has("<｜Assistant｜>") && has("<｜User｜>") && has("<｜end▁of▁sentence｜>")
    {
        Deepseek3
    } else if has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]") {
        if has("[|tool|]") {
            Exaone4
        } else {
            Exaone3
        }
    } else if has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}") {
        RwkvWorld
    } else if has("<|start_of_role|>") {
        match (
            has("<tool_call>") || has("<tools>"),
            has("g4_default_system_message"),
        ) {
            (true, true) => Granite40,
            (true, false) => Granite41,
            _ => Granite3,
        }
    } else {
        return LAST_RULES
            .iter()
            .find(|(markers, _)| markers.iter().all(|m| has(m)))
            .map(|&(_, format)| format);
    };
    Some(format)
}

/// The end of llama.cpp's chain: the first format whose markers are all in the template.
const LAST_RULES: &[(&[&str], ChatFormat)] = &[
    (
        &["message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"],
        ChatFormat::GigaChat,
    ),
    (&["<|role_start|>"], ChatFormat::Megrez),
    (&[" Ассистент:"], ChatFormat::Yandex),
    (&["<role>ASSISTANT</role>", "'HUMAN'"], ChatFormat::Bailing),
    (
        &["<role>ASSISTANT</role>", "\"HUMAN\"", "<think>"],
        ChatFormat::BailingThink,
    ),
    (
        &["<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"],
        ChatFormat::Bailing2,
    ),
    (&["<|header_start|>", "<|header_end|>"], ChatFormat::Llama4),
    (&["<|endofuserprompt|>"], ChatFormat::Dots1),
    (&["<|extra_0|>", "<|extra_4|>"], ChatFormat::HunyuanMoe),
    (&["<|start|>", "<|channel|>"], ChatFormat::GptOss),
    (
        &["<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"],
        ChatFormat::HunyuanVl,
    ),
    (
        &["<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"],
        ChatFormat::HunyuanDense,
    ),
    (&["<|im_assistant|>assistant<|im_middle|>"], ChatFormat::KimiK2),
    (&["<seed:bos>"], ChatFormat::SeedOss),
    (
        &["'Assistant: '  + message['content'] + '<|separator|>"],
        ChatFormat::Grok2,
    ),
    (&["[unused9]系统：[unused10]"], ChatFormat::PanguEmbedded),
    (&["<|begin|>", "<|end|>", "<|content|>"], ChatFormat::SolarOpen),
];

/// The Mistral and Llama 2 branch of the detection (`[INST]` or a name starting `mistral`).
fn mistral_or_llama2(template: &str) -> ChatFormat {
    use ChatFormat::*;
    let has = |s: &str| template.contains(s);
    if has("[SYSTEM_PROMPT]") {
        MistralV7
    } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
        if has(" [INST]") {
            MistralV1
        } else if has("\"[INST]\"") {
            MistralV3Tekken
        } else {
            MistralV3
        }
    } else if has("content.strip()") {
        Llama2SysStrip
    } else if has("bos_token + '[INST]") {
        Llama2SysBos
    } else if has("<<SYS>>") {
        Llama2Sys
    } else {
        Llama2
    }
}

/// llama.cpp's `trim`: C's `isspace` characters off both ends.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'))
}

/// Every turn as `open role mid content close`.
fn tagged(out: &mut String, turns: &[(&str, &str)], (open, mid, close): (&str, &str, &str)) {
    for (role, content) in turns {
        *out += &format!("{open}{role}{mid}{content}{close}");
    }
}

fn mistral_v7(out: &mut String, turns: &[(&str, &str)], spaced: bool) {
    let space = if spaced { " " } else { "" };
    for &(role, content) in turns {
        *out += &match role {
            "system" => format!("[SYSTEM_PROMPT]{space}{content}[/SYSTEM_PROMPT]"),
            "user" => format!("[INST]{space}{content}[/INST]"),
            _ => format!("{space}{content}</s>"),
        };
    }
}

fn mistral(out: &mut String, turns: &[(&str, &str)], format: ChatFormat) {
    let leading = if format == ChatFormat::MistralV1 {
        " "
    } else {
        ""
    };
    let trailing = if format == ChatFormat::MistralV3Tekken {
        ""
    } else {
        " "
    };
    let mut inside_turn = false;
    for &(role, content) in turns {
        if !inside_turn {
            *out += &format!("{leading}[INST]{trailing}");
            inside_turn = true;
        }
        match role {
            "system" => *out += &format!("{content}\n\n"),
            "user" => *out += &format!("{content}{leading}[/INST]"),
            _ => {
                let content = match format {
                    ChatFormat::MistralV3 => trim(content),
                    _ => content,
                };
                *out += &format!("{trailing}{content}</s>");
                inside_turn = false;
            }
        }
    }
}

fn llama2(out: &mut String, turns: &[(&str, &str)], format: ChatFormat) {
    let system_message = format != ChatFormat::Llama2;
    let bos_in_history = format == ChatFormat::Llama2SysBos;
    let strip = format == ChatFormat::Llama2SysStrip;
    // The first turn's BOS is the tokenizer's.
    let mut inside_turn = true;
    *out += "[INST] ";
    for &(role, content) in turns {
        let content = if strip { trim(content) } else { content };
        if !inside_turn {
            inside_turn = true;
            *out += if bos_in_history {
                "<s>[INST] "
            } else {
                "[INST] "
            };
        }
        match role {
            "system" if system_message => *out += &format!("<<SYS>>\n{content}\n<</SYS>>\n\n"),
            // Without a system role the text still opens the first message, unmarked.
            "system" => *out += &format!("{content}\n"),
            "user" => *out += &format!("{content} [/INST]"),
            _ => {
                *out += &format!("{content}</s>");
                inside_turn = false;
            }
        }
    }
}

/// Gemma's turns: contents trimmed, `assistant` called `model`, system text merged into the
/// next user turn.
fn gemma(out: &mut String, turns: &[(&str, &str)]) {
    let mut system = String::new();
    for &(role, content) in turns {
        if role == "system" {
            system += trim(content);
            continue;
        }
        let role = if role == "assistant" { "model" } else { role };
        *out += &format!("<start_of_turn>{role}\n");
        if !system.is_empty() && role != "model" {
            *out += &format!("{}\n\n", std::mem::take(&mut system));
        }
        *out += &format!("{}<end_of_turn>\n", trim(content));
    }
    *out += "<start_of_turn>model\n";
}

/// [`ChatFormat::apply`] for the formats past its first branches.
fn apply_more(format: ChatFormat, out: &mut String, turns: &[(&str, &str)]) {
    use ChatFormat::*;
    match format {
        Monarch => {
            for (i, (role, content)) in turns.iter().enumerate() {
                let bos = if i == 0 { "" } else { "<s>" };
                *out += &format!("{bos}{role}\n{content}</s>\n");
            }
            *out += "<s>assistant\n";
        }
        Orion => {
            let mut system = String::new();
            for &(role, content) in turns {
                match role {
                    "system" => system += content,
                    "user" => {
                        *out += "Human: ";
                        if !system.is_empty() {
                            *out += &format!("{}\n\n", std::mem::take(&mut system));
                        }
                        *out += &format!("{content}\n\nAssistant: </s>");
                    }
                    _ => *out += &format!("{content}</s>"),
                }
            }
        }
        OpenChat => {
            for &(role, content) in turns {
                *out += &match role {
                    "system" => format!("{content}<|end_of_turn|>"),
                    _ => format!(
                        "GPT4 Correct {}: {content}<|end_of_turn|>",
                        capitalized(role)
                    ),
                };
            }
            *out += "GPT4 Correct Assistant:";
        }
        CommandR => {
            for &(role, content) in turns {
                let token = match role {
                    "system" => "<|SYSTEM_TOKEN|>",
                    "user" => "<|USER_TOKEN|>",
                    "assistant" => "<|CHATBOT_TOKEN|>",
                    _ => continue,
                };
                *out += &format!(
                    "<|START_OF_TURN_TOKEN|>{token}{}<|END_OF_TURN_TOKEN|>",
                    trim(content)
                );
            }
            *out += "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
        }
        ChatGlm3 => {
            *out += "[gMASK]sop";
            tagged(out, turns, ("<|", "|>\n ", ""));
            *out += "<|assistant|>";
        }
        ChatGlm4 => {
            *out += "[gMASK]<sop>";
            tagged(out, turns, ("<|", "|>\n", ""));
            *out += "<|assistant|>\n";
        }
        MiniCpm => {
            for &(role, content) in turns {
                *out += &match role {
                    "user" => format!("<用户>{}<AI>", trim(content)),
                    _ => trim(content).to_string(),
                };
            }
        }
        DeepseekOcr => turns.iter().for_each(|(_, content)| *out += content),
        _ => apply_last(format, out, turns),
    }
}

/// [`apply_more`]'s remaining formats.
fn apply_last(format: ChatFormat, out: &mut String, turns: &[(&str, &str)]) {
    use ChatFormat::*;
    match format {
        Exaone3 | Exaone4 => {
            for &(role, content) in turns {
                let content = trim(content);
                *out += &match role {
                    "system" => format!("[|system|]{content}[|endofturn|]\n"),
                    "user" => format!("[|user|]{content}\n"),
                    "assistant" => format!("[|assistant|]{content}[|endofturn|]\n"),
                    "tool" if format == Exaone4 => format!("[|tool|]{content}[|endofturn|]\n"),
                    _ => String::new(),
                };
            }
            *out += "[|assistant|]";
        }
        ExaoneMoe => {
            for &(role, content) in turns {
                if matches!(role, "system" | "user" | "assistant" | "tool") {
                    *out += &format!("<|{role}|>\n{}<|endofturn|>\n", trim(content));
                }
            }
            *out += "<|assistant|>\n";
        }
        RwkvWorld => {
            for (i, &(role, content)) in turns.iter().enumerate() {
                let content = trim(content);
                match role {
                    "system" => *out += &format!("System: {content}\n\n"),
                    "user" => {
                        *out += &format!("User: {content}\n\n");
                        if i + 1 == turns.len() {
                            *out += "Assistant:";
                        }
                    }
                    "assistant" => *out += &format!("Assistant: {content}\n\n"),
                    _ => {}
                }
            }
        }
        Granite3 => {
            for &(role, content) in turns {
                *out += &format!("<|start_of_role|>{role}<|end_of_role|>");
                if role == "assistant_tool_call" {
                    *out += "<|tool_call|>";
                }
                *out += &format!("{content}<|end_of_text|>\n");
            }
            *out += "<|start_of_role|>assistant<|end_of_role|>";
        }
        Granite40 | Granite41 => {
            for &(role, content) in turns {
                *out += &match role {
                    "assistant_tool_call" => {
                        "<|start_of_role|>assistant<|end_of_role|><|tool_call|>".to_string()
                    }
                    _ => format!("<|start_of_role|>{role}<|end_of_role|>"),
                };
                *out += &format!("{content}<|end_of_text|>\n");
            }
            *out += "<|start_of_role|>assistant<|end_of_role|>";
        }
        GigaChat => gigachat(out, turns),
        Yandex => {
            for &(role, content) in turns {
                match role {
                    "user" => *out += &format!(" Пользователь: {content}\n\n"),
                    "assistant" => *out += &format!(" Ассистент: {content}\n\n"),
                    _ => {}
                }
            }
            *out += " Ассистент:[SEP]";
        }
        Bailing | BailingThink => {
            for &(role, content) in turns {
                *out += &format!("<role>{}</role>{content}", bailing_role(role));
            }
            *out += "<role>ASSISTANT</role>";
            if format == BailingThink {
                *out += "<think>";
            }
        }
        Bailing2 => {
            if turns.first().map(|t| t.0) != Some("system") {
                *out += "<role>SYSTEM</role>detailed thinking off<|role_end|>";
            }
            for &(role, content) in turns {
                *out += &format!("<role>{}</role>{content}<|role_end|>", bailing_role(role));
            }
            *out += "<role>ASSISTANT</role>";
        }
        _ => apply_newest(format, out, turns),
    }
}

/// [`apply_last`]'s remaining formats: the newest of llama.cpp's list.
fn apply_newest(format: ChatFormat, out: &mut String, turns: &[(&str, &str)]) {
    use ChatFormat::*;
    match format {
        SmolVlm => {
            *out += "<|im_start|>";
            for &(role, content) in turns {
                *out += &match role {
                    "system" => format!("{content}\n\n"),
                    "user" => format!("User: {content}<end_of_utterance>\n"),
                    _ => format!("Assistant: {content}<end_of_utterance>\n"),
                };
            }
            *out += "Assistant:";
        }
        Dots1 => {
            for &(role, content) in turns {
                *out += &match role {
                    "system" => format!("<|system|>{content}<|endofsystem|>"),
                    "user" => format!("<|userprompt|>{content}<|endofuserprompt|>"),
                    _ => format!("<|response|>{content}<|endofresponse|>"),
                };
            }
            *out += "<|response|>";
        }
        HunyuanMoe => {
            for &(role, content) in turns {
                *out += &match role {
                    "system" => format!("<|startoftext|>{content}<|extra_4|>"),
                    "assistant" => format!("{content}<|eos|>"),
                    _ => format!("<|startoftext|>{content}<|extra_0|>"),
                };
            }
        }
        GptOss => {
            for &(role, content) in turns {
                let end = if role == "assistant" {
                    "<|return|>"
                } else {
                    "<|end|>"
                };
                *out += &format!("<|start|>{role}<|message|>{content}{end}");
            }
            *out += "<|start|>assistant";
        }
        HunyuanDense => {
            for (i, &(role, content)) in turns.iter().enumerate() {
                if i == 0 && role == "system" {
                    *out += &format!("{content}<｜hy_place▁holder▁no▁3｜>");
                }
                match role {
                    "assistant" => {
                        *out += &format!("<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>")
                    }
                    "user" => *out += &format!("<｜hy_User｜>{content}<｜hy_Assistant｜>"),
                    _ => {}
                }
            }
        }
        HunyuanVl => {
            *out += "<｜hy_begin▁of▁sentence｜>";
            for (i, &(role, content)) in turns.iter().enumerate() {
                match role {
                    "system" if i == 0 => *out += &format!("{content}<｜hy_place▁holder▁no▁3｜>"),
                    "user" => *out += &format!("{content}<｜hy_User｜>"),
                    "assistant" => *out += &format!("{content}<｜hy_Assistant｜>"),
                    _ => {}
                }
            }
        }
        KimiK2 => {
            for &(role, content) in turns {
                *out += match role {
                    "system" => "<|im_system|>system<|im_middle|>",
                    "user" => "<|im_user|>user<|im_middle|>",
                    "assistant" => "<|im_assistant|>assistant<|im_middle|>",
                    "tool" => "<|im_system|>tool<|im_middle|>",
                    _ => "",
                };
                *out += &format!("{content}<|im_end|>");
            }
            *out += "<|im_assistant|>assistant<|im_middle|>";
        }
        SeedOss => {
            for &(role, content) in turns {
                let content = if role == "assistant" {
                    trim(content)
                } else {
                    content
                };
                *out += &format!("<seed:bos>{role}\n{content}<seed:eos>");
            }
            *out += "<seed:bos>assistant\n";
        }
        Grok2 => {
            for &(role, content) in turns {
                *out += &match role {
                    "system" => format!("System: {}<|separator|>\n\n", trim(content)),
                    "user" => format!("Human: {}<|separator|>\n\n", trim(content)),
                    "assistant" => format!("Assistant: {content}<|separator|>\n\n"),
                    _ => String::new(),
                };
            }
            *out += "Assistant:";
        }
        PanguEmbedded => {
            for (i, &(role, content)) in turns.iter().enumerate() {
                if i == 0 && role != "system" {
                    *out += "[unused9]系统：[unused10]";
                }
                let name = match role {
                    "system" => "系统",
                    "user" => "用户",
                    "assistant" => "助手",
                    "tool" => "工具",
                    "function" => "方法",
                    _ => continue,
                };
                *out += &format!("[unused9]{name}：{content}[unused10]");
            }
            *out += "[unused9]助手：";
        }
        // Every other format is written by `apply` (the tagged and by-role ones among them),
        // `apply_more` or `apply_last`.
        _ => {}
    }
}

/// Turns of the roles in `parts` as `prefix content suffix`; other roles are left out.
fn by_role(out: &mut String, turns: &[(&str, &str)], parts: &[RolePart]) {
    for &(role, content) in turns {
        if let Some((_, prefix, suffix)) = parts.iter().find(|(r, _, _)| *r == role) {
            *out += &format!("{prefix}{content}{suffix}");
        }
    }
}

/// `role` with its first letter in upper case (ASCII), as llama.cpp's `toupper(role[0])`.
fn capitalized(role: &str) -> String {
    let mut chars = role.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// Bailing's role names: `user` is `HUMAN`, the others in upper case.
fn bailing_role(role: &str) -> String {
    match role {
        "user" => "HUMAN".to_string(),
        _ => role.to_ascii_uppercase(),
    }
}

fn gigachat(out: &mut String, turns: &[(&str, &str)]) {
    let rest = match turns.first() {
        Some(&("system", content)) => {
            *out += &format!("<s>{content}<|message_sep|>");
            &turns[1..]
        }
        _ => {
            *out += "<s>";
            turns
        }
    };
    for &(role, content) in rest {
        match role {
            "user" => {
                *out += &format!(
                    "user<|role_sep|>{content}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
                )
            }
            "assistant" => *out += &format!("assistant<|role_sep|>{content}<|message_sep|>"),
            _ => {}
        }
    }
    *out += "assistant<|role_sep|>";
}
