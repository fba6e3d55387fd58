//! `rgml chat`: a conversation in the terminal. Each line typed is a user turn; the whole
//! conversation goes through the chat template, and only what the session does not hold yet
//! is evaluated (the tokens shared with the last turn's prompt and reply stay cached). The
//! reply streams as it is sampled. `/reset` forgets the conversation, `/exit` (or end of
//! input) ends the chat, and Ctrl-C stops a reply without ending it (at the prompt it ends
//! the program, as in a shell without a line).

use crate::error::CliError;
use crate::model_cmds::{
    chat_choice, check_logit_bias, prompt_tokens, sampler_params, ChatTemplateArgs, ModelArgs,
    SamplingArgs,
};
use clap::Args;
use rgml_llm::chat::Message;
use rgml_llm::{Sampler, Session, TokenId};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Flags of `rgml chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    template: ChatTemplateArgs,
    /// Most tokens in one reply (0: until the model ends its turn or the context is full).
    #[arg(short = 'n', long, default_value_t = 0)]
    n_predict: usize,
}

/// What Ctrl-C does: stop the reply being written, or end the program at the prompt.
#[derive(Default)]
struct Interrupt {
    replying: AtomicBool,
    stop: AtomicBool,
}

/// The conversation and what the session holds of it.
struct Conversation {
    /// The system message, kept across `/reset`.
    system: Option<String>,
    messages: Vec<Message>,
    /// The tokens the session's cache holds, in order.
    cached: Vec<TokenId>,
}

impl Conversation {
    fn new(system: Option<String>) -> Conversation {
        let mut c = Conversation {
            system,
            messages: Vec::new(),
            cached: Vec::new(),
        };
        c.reset();
        c
    }

    fn reset(&mut self) {
        self.messages.clear();
        self.messages
            .extend(self.system.iter().map(|s| Message::new("system", s)));
        self.cached.clear();
    }
}

/// `rgml chat`.
pub fn run(args: ChatArgs) -> Result<bool, CliError> {
    let params = sampler_params(&args.sampling)?;
    let choice = chat_choice(
        args.template.chat_template.as_deref(),
        args.template.chat_template_file.as_deref(),
    )?;
    let model = args.model.load()?;
    check_logit_bias(&params.logit_bias, model.config.n_vocab)?;
    let formatter = choice.formatter(&model, !args.template.no_jinja);
    let n_ctx = args.model.ctx_size();
    let mut session = args.model.session(&model, n_ctx)?;
    let interrupt = Arc::new(Interrupt::default());
    let on_ctrl_c = interrupt.clone();
    ctrlc::set_handler(move || match on_ctrl_c.replying.load(Ordering::Acquire) {
        true => on_ctrl_c.stop.store(true, Ordering::Release),
        false => {
            println!();
            std::process::exit(130);
        }
    })
    .map_err(|e| CliError::Message(format!("catching Ctrl-C: {e}")))?;
    eprintln!(
        "rgml chat: {} tokens of context. /reset forgets the conversation, /exit or Ctrl-D \
         ends it, Ctrl-C stops a reply.",
        n_ctx
    );
    let mut chat = Conversation::new(args.template.system.clone());
    let mut lines = std::io::stdin().lock().lines();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let Some(line) = lines.next().transpose()? else {
            println!();
            break;
        };
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                chat.reset();
                println!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        chat.messages.push(Message::new("user", &line));
        let prompt = match formatter.apply(&chat.messages) {
            Ok(prompt) => prompt_tokens(&model.tokenizer, &prompt)?,
            Err(e) => {
                chat.messages.pop();
                eprintln!("the chat template failed: {e}");
                continue;
            }
        };
        if prompt.len() >= n_ctx {
            chat.messages.pop();
            eprintln!(
                "the conversation needs {} tokens, the context holds {n_ctx} (-c): /reset to \
                 start again",
                prompt.len()
            );
            continue;
        }
        let reply = answer(
            &mut session,
            &mut chat,
            &prompt,
            &params,
            args.n_predict,
            &interrupt,
        )?;
        chat.messages.push(Message::new("assistant", &reply));
    }
    args.model.finish()?;
    Ok(true)
}

/// Evaluates what the session lacks of `prompt`, streams a reply of at most `n_predict`
/// tokens (0: no limit) to stdout and returns its text; updates what the session holds.
fn answer(
    session: &mut Session,
    chat: &mut Conversation,
    prompt: &[TokenId],
    params: &rgml_llm::SamplerParams,
    n_predict: usize,
    interrupt: &Interrupt,
) -> Result<String, CliError> {
    let model = session.model().clone();
    let tok = &model.tokenizer;
    // Keep the common prefix, less one token: the last prompt token's logits are needed.
    let common = chat
        .cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let mut keep = common.min(prompt.len() - 1);
    if session.seq_rm(0, keep..usize::MAX).is_err() {
        // A recurrent state cannot go back part of the way: start over.
        session.reset();
        keep = 0;
    }
    chat.cached.truncate(keep);
    let room = session.n_ctx() - prompt.len();
    let max_tokens = match n_predict {
        0 => room,
        n => n.min(room),
    };
    let mut sampler = Sampler::new(params.clone());
    interrupt.stop.store(false, Ordering::Release);
    interrupt.replying.store(true, Ordering::Release);
    let t0 = Instant::now();
    let mut generation = session.generate(&prompt[keep..], &mut sampler, max_tokens)?;
    let t_prompt = t0.elapsed();
    let mut decoder = tok.decoder(false);
    let (mut text, mut reply) = (String::new(), Vec::new());
    let mut out = std::io::stdout().lock();
    let t1 = Instant::now();
    for next in &mut generation {
        let token = next?;
        reply.push(token);
        let piece = decoder.push(token)?;
        write!(out, "{piece}")?;
        out.flush()?;
        text += &piece;
        if interrupt.stop.load(Ordering::Acquire) {
            break;
        }
    }
    let n_past = generation.session().n_past();
    interrupt.replying.store(false, Ordering::Release);
    let rest = decoder.finish();
    text += &rest;
    writeln!(out, "{rest}")?;
    if interrupt.stop.load(Ordering::Acquire) {
        writeln!(out, "(stopped)")?;
    }
    chat.cached = prompt.iter().chain(&reply).copied().take(n_past).collect();
    let secs = t1.elapsed().as_secs_f64().max(1e-9);
    crate::note!(
        "[prompt: {} tokens, {keep} reused, {:.0} ms; reply: {} tokens, {:.1} tok/s]",
        prompt.len(),
        t_prompt.as_secs_f64() * 1e3,
        reply.len(),
        reply.len() as f64 / secs
    );
    Ok(text)
}
