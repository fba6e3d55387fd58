//! `rgml embed`: a prompt's pooled embedding, as llama.cpp's `llama-embedding` computes it
//! (and `rgml serve`'s `/v1/embeddings`).

use crate::error::CliError;
use crate::model_cmds::ModelArgs;
use clap::Args;
use rgml_llm::embed::{normalize, Pooling};
use rgml_llm::{Session, SessionOptions};
use std::io::Write;

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Prompt (special tokens such as `<|im_start|>` are parsed; BOS and EOS as the
    /// vocabulary adds them).
    #[arg(short = 'p', long)]
    prompt: String,
    /// How the tokens' hidden states pool: `mean`, `cls` or `last` (default: as the model
    /// file says, else by the last token).
    #[arg(long, value_parser = Pooling::NAMES)]
    pooling: Option<String>,
    /// Normalisation (llama.cpp's `--embd-normalize`): 2, Euclidean (the default, as
    /// llama-server's), or -1, none. llama.cpp's other norms are refused.
    #[arg(long, default_value_t = 2, allow_hyphen_values = true)]
    embd_normalize: i32,
}

/// Print `{"tokens": [...], "pooling": NAME, "embedding": [...]}`.
pub fn run(args: EmbedArgs) -> Result<bool, CliError> {
    if !matches!(args.embd_normalize, -1 | 2) {
        return Err(CliError::usage(format!(
            "--embd-normalize {}: only 2 (Euclidean) and -1 (none) are supported",
            args.embd_normalize
        )));
    }
    let model = args.model.load()?;
    let tokens = crate::model_cmds::prompt_tokens(&model.tokenizer, &args.prompt)?;
    let options = SessionOptions {
        embeddings: true,
        ..args
            .model
            .session_options(tokens.len().next_multiple_of(256), 1)
    };
    let mut session = Session::new(model.clone(), &options)?;
    let pooling = (args.pooling.as_deref().and_then(Pooling::from_name))
        .or(model.config.pooling)
        .unwrap_or(Pooling::Last);
    let mut embedding = session.embed(&tokens, pooling)?;
    if args.embd_normalize == 2 {
        normalize(&mut embedding);
    }
    let v = serde_json::json!({
        "tokens": tokens,
        "pooling": pooling.name(),
        "embedding": embedding,
    });
    writeln!(std::io::stdout().lock(), "{v}")?;
    Ok(true)
}
