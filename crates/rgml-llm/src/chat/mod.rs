//! Chat formatting: turning a conversation into the prompt text a model was trained on.
//!
//! Models in GGUF carry a Jinja chat template (`tokenizer.chat_template`); [`ChatFormatter`]
//! runs it (or a template file's) with [`ChatTemplate`], as llama.cpp's `--jinja` does. A
//! file without a template, or with one minijinja cannot compile, falls back to
//! [`ChatFormat`], llama.cpp's built-in formats (`--no-jinja`): the one llama.cpp recognises
//! in the template, or without a template the architecture's own format where it has one
//! (Gemma's files often carry none); otherwise ChatML (`<|im_start|>role\n…<|im_end|>\n`,
//! the demo model's).

mod builtin;

use crate::chat_template::{value_from_json, ChatTemplate, ChatTemplateError, ChatTemplateInputs};
use crate::Model;

pub use builtin::ChatFormat;

pub use crate::message::{Message, ToolCall};
use crate::tool_calls::ToolCallFormat;

/// How a conversation becomes a model's prompt: its Jinja template, or the marker format.
#[derive(Debug)]
pub enum ChatFormatter {
    /// A compiled Jinja template, with whether the tokenizer adds BOS/EOS itself.
    Template {
        /// The template.
        template: Box<ChatTemplate>,
        /// The tokenizer adds BOS: a BOS text the template starts with is dropped.
        strip_bos: Option<String>,
        /// The tokenizer adds EOS: an EOS text the template ends with is dropped.
        strip_eos: Option<String>,
        /// How the template's model writes tool calls, where it shows them.
        tool_format: Option<ToolCallFormat>,
        /// How the template shows reasoning, where it does.
        thinking: Option<crate::reasoning::Syntax>,
    },
    /// The fallback marker format.
    Markers(ChatFormat),
}

impl ChatFormatter {
    /// The formatter for `model`: `template` (a `--chat-template-file`'s text), or with
    /// `jinja` the file's `tokenizer.chat_template`, run as Jinja; else the marker format.
    ///
    /// The CLI and the server ask for Jinja by default, as llama.cpp's `--jinja` (its default
    /// in llama-server and llama-cli); `--no-jinja` keeps the marker format, whose prompts
    /// differ where a template adds text of its own (the demo model's adds a default system
    /// message).
    pub fn for_model(model: &Model, template: Option<&str>, jinja: bool) -> ChatFormatter {
        let tok = &model.tokenizer;
        let text = |id: Option<crate::TokenId>| {
            id.and_then(|id| tok.token_text(id))
                .unwrap_or_default()
                .to_string()
        };
        let (bos, eos) = (text(tok.bos()), text(tok.eos()));
        let source = template.or(model.chat_template().filter(|_| jinja));
        match source.map(|s| (ChatTemplate::new(s, &bos, &eos), s)) {
            Some((Ok(t), source)) => ChatFormatter::Template {
                template: Box::new(t),
                strip_bos: (tok.add_bos() && !bos.is_empty()).then_some(bos),
                strip_eos: (tok.add_eos() && !eos.is_empty()).then_some(eos),
                tool_format: ToolCallFormat::detect(source),
                thinking: crate::reasoning::Syntax::detect(source),
            },
            _ => ChatFormatter::Markers(ChatFormat::for_model(
                model.config.kind,
                model.chat_template(),
            )),
        }
    }

    /// The prompt for `messages`, ending with the opening of the assistant's turn.
    pub fn apply(&self, messages: &[Message]) -> Result<String, ChatTemplateError> {
        self.apply_with_tools(messages, None)
    }

    /// How the model writes tool calls: the Jinja template's format, `None` for a template
    /// that shows none and for the marker formats.
    pub fn tool_format(&self) -> Option<ToolCallFormat> {
        match self {
            ChatFormatter::Template { tool_format, .. } => *tool_format,
            ChatFormatter::Markers(_) => None,
        }
    }

    /// The Jinja template's text, where one runs (`None` for the marker formats).
    pub fn template_source(&self) -> Option<&str> {
        match self {
            ChatFormatter::Template { template, .. } => Some(template.source()),
            ChatFormatter::Markers(_) => None,
        }
    }

    /// How the model writes its reasoning, where its Jinja template shows it (`<think>` tags,
    /// harmony's analysis channel).
    pub fn reasoning_syntax(&self) -> Option<crate::reasoning::Syntax> {
        match self {
            ChatFormatter::Template { thinking, .. } => *thinking,
            ChatFormatter::Markers(_) => None,
        }
    }

    /// [`ChatFormatter::apply`] with `tools` (the OpenAI `tools` list, as JSON text: its keys'
    /// order reaches the template, whose `tojson` shows it) for the template. Only a Jinja
    /// template presents tools, tool calls and tool results; the marker formats refuse them
    /// rather than drop them.
    pub fn apply_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&str>,
    ) -> Result<String, ChatTemplateError> {
        match self {
            ChatFormatter::Markers(format) => {
                let tool_parts = messages
                    .iter()
                    .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
                if tools.is_some() || tool_parts {
                    return Err(ChatTemplateError::Render(
                        "tools, tool calls and tool results need the model's Jinja chat \
                         template (drop --no-jinja, or give --chat-template-file)"
                            .into(),
                    ));
                }
                Ok(format.apply(messages))
            }
            ChatFormatter::Template {
                template,
                strip_bos,
                strip_eos,
                ..
            } => {
                let mut inputs = ChatTemplateInputs::from_messages(messages);
                inputs.tools = tools.map(value_from_json).transpose()?;
                let text = template.render(&inputs)?;
                // llama.cpp drops what the tokenizer adds again (common_chat_templates_apply).
                let text = match strip_bos {
                    Some(bos) => text.strip_prefix(bos.as_str()).unwrap_or(&text),
                    None => &text,
                };
                let text = match strip_eos {
                    Some(eos) => text.strip_suffix(eos.as_str()).unwrap_or(text),
                    None => text,
                };
                Ok(text.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_matches_the_fixture_prompt() {
        let text = ChatFormat::for_model(
            crate::config::Arch::Llama,
            Some("{{ '<|im_start|>' + message['role'] }}"),
        )
        .apply(&[Message::new("user", "What is the boiling point of water?")]);
        assert_eq!(
            text,
            "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn detects_other_formats() {
        assert_eq!(
            ChatFormat::detect("<|start_header_id|>{{ role }}<|end_header_id|>"),
            Some(ChatFormat::Llama3)
        );
        assert_eq!(ChatFormat::detect("[INST]"), Some(ChatFormat::Llama2));
        assert_eq!(
            ChatFormat::detect("mistral-v7"),
            Some(ChatFormat::MistralV7)
        );
        assert_eq!(ChatFormat::detect("{{ messages }}"), None);
        assert_eq!(
            ChatFormat::for_model(crate::config::Arch::Llama, Some("{{ messages }}")),
            ChatFormat::ChatMl
        );
        assert_eq!(
            ChatFormat::for_model(crate::config::Arch::Gemma3, None),
            ChatFormat::Gemma
        );
        assert_eq!(
            ChatFormat::for_model(crate::config::Arch::Llama, None),
            ChatFormat::ChatMl
        );
    }

    #[test]
    fn gemma_turns() {
        let text = ChatFormat::Gemma.apply(&[
            Message::new("system", " Be brief. "),
            Message::new("user", "Hi "),
            Message::new("assistant", "Hello!"),
            Message::new("user", "Bye"),
        ]);
        assert_eq!(
            text,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
