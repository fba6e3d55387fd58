//! Markers in streamed text (`<think>`, `</think>`, `<tool_call>`, ...): how much of a text's end
//! may be the start of one, so a stream holds those bytes back until the next piece tells.
//! Shared by `reasoning`, `harmony` and `tool_calls`, with the [`Part`]s a streamed output is
//! split into.

/// Which part of the output a piece of streamed text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Reasoning (`reasoning_content`).
    Reasoning,
    /// The answer (`content`).
    Content,
}

/// Bytes at the end of `text` that are a proper beginning of `marker` (0 if none).
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            n <= text.len()
                && text.is_char_boundary(text.len() - n)
                && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// Where `marker` starts in `text`, or where a beginning of it ends `text`.
pub(crate) fn marker_from(text: &str, marker: &str) -> Option<usize> {
    match text.find(marker) {
        Some(at) => Some(at),
        None => Some(text.len() - partial_suffix(text, marker)).filter(|&at| at < text.len()),
    }
}
