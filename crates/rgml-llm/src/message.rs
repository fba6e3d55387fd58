//! One message of a conversation: what the chat formats (`chat`) and the Jinja templates
//! (`chat_template`) both take, and the tool calls an assistant's message may carry (which the
//! output parser, `tool_calls`, produces), in a module of its own below them.

/// One message of a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant's calls of tools (OpenAI's `tool_calls`).
    pub tool_calls: Vec<ToolCall>,
    /// A tool's result: the call it answers (OpenAI's `tool_call_id`).
    pub tool_call_id: Option<String>,
    /// A tool's result: the tool's name (OpenAI's `name`).
    pub name: Option<String>,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
            ..Message::default()
        }
    }
}

/// A call of a tool (a function) by the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, where the model or the client gave one.
    pub id: Option<String>,
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object, as text.
    pub arguments: String,
}
