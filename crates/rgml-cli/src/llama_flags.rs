//! llama.cpp's multi-letter short flags (`-ngl`, `-fa`, `-ctk`, `-ctv`, `-ot`, `-cmoe`,
//! `-ncmoe`, and `-np` of `serve`), which clap cannot
//! declare (its short flags are one letter), rewritten to their long forms before parsing.
//!
//! This module owns that rewrite only. A value is never rewritten: a word that follows an
//! option taking a value (`rgml run -p -ngl` prompts "-ngl"), or comes after `--`, stays as it
//! is; which options take values is read from the clap definition, so it cannot drift.

use std::ffi::OsString;

/// The multi-letter short flags of `subcommand` and their long forms.
fn spellings(subcommand: &str) -> &'static [(&'static str, &'static str)] {
    const NGL: (&str, &str) = ("-ngl", "--n-gpu-layers");
    const FA: (&str, &str) = ("-fa", "--flash-attn");
    const CTK: (&str, &str) = ("-ctk", "--cache-type-k");
    const CTV: (&str, &str) = ("-ctv", "--cache-type-v");
    const OT: (&str, &str) = ("-ot", "--override-tensor");
    const CMOE: (&str, &str) = ("-cmoe", "--cpu-moe");
    const NCMOE: (&str, &str) = ("-ncmoe", "--n-cpu-moe");
    match subcommand {
        "serve" => &[("-np", "--parallel"), NGL, FA, CTK, CTV, OT, CMOE, NCMOE],
        "run" | "chat" | "logits" | "embed" | "perplexity" | "bench" => {
            &[NGL, FA, CTK, CTV, OT, CMOE, NCMOE]
        }
        "compare" => &[FA],
        _ => &[],
    }
}

/// `args` (program name first) with the subcommand's llama.cpp flags in their long forms,
/// `-ngl 8` and `-ngl=8` alike; `cli` is the command line's definition.
pub fn rewrite(args: Vec<OsString>, cli: &clap::Command) -> Vec<OsString> {
    let Some(sub) = args
        .get(1)
        .and_then(|a| a.to_str())
        .and_then(|name| cli.find_subcommand(name))
    else {
        return args;
    };
    let table = spellings(sub.get_name());
    let mut out = Vec::with_capacity(args.len());
    let mut words = args.into_iter();
    out.extend(words.by_ref().take(2));
    while let Some(word) = words.next() {
        let Some(text) = word.to_str() else {
            out.push(word);
            continue;
        };
        if text == "--" {
            out.push(word);
            out.extend(words.by_ref());
            break;
        }
        let text = respell(text, table);
        let value_follows = takes_separate_value(sub, &text);
        out.push(text.into());
        if value_follows {
            out.extend(words.next());
        }
    }
    out
}

/// `word` in its long form if it is one of `table`'s short spellings (alone or `=value`).
fn respell(word: &str, table: &[(&str, &str)]) -> String {
    for (short, long) in table {
        if word == *short {
            return long.to_string();
        }
        if let Some(value) = word.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
            return format!("{long}={value}");
        }
    }
    word.to_string()
}

/// Whether `word` is an option of `sub` whose value is the next word (`-p X`, `--prompt X`;
/// not `--prompt=X`, `-pX` or a switch).
fn takes_separate_value(sub: &clap::Command, word: &str) -> bool {
    let matches = |arg: &clap::Arg| {
        if let Some(long) = word.strip_prefix("--") {
            arg.get_long() == Some(long) || arg.get_all_aliases().is_some_and(|a| a.contains(&long))
        } else {
            let mut chars = word.chars();
            chars.next() == Some('-')
                && chars.next().is_some_and(|c| arg.get_short() == Some(c))
                && chars.next().is_none()
        }
    };
    sub.get_arguments()
        .find(|arg| matches(arg))
        .is_some_and(|arg| arg.get_action().takes_values())
}

#[cfg(test)]
mod tests {
    use super::rewrite;
    use clap::CommandFactory;

    fn rewritten(args: &[&str]) -> Vec<String> {
        let args = args.iter().map(|a| a.into()).collect();
        rewrite(args, &crate::Cli::command())
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn np_is_parallel_for_serve_only() {
        assert_eq!(
            rewritten(&["rgml", "serve", "-np", "8", "-np=2"]),
            ["rgml", "serve", "--parallel", "8", "--parallel=2"]
        );
        assert_eq!(
            rewritten(&["rgml", "bench", "-np", "8"]),
            ["rgml", "bench", "-np", "8"]
        );
    }

    #[test]
    fn ngl_is_n_gpu_layers_for_the_model_commands() {
        for cmd in ["run", "logits", "perplexity", "bench", "serve"] {
            assert_eq!(
                rewritten(&["rgml", cmd, "-ngl", "8", "-m", "x"]),
                ["rgml", cmd, "--n-gpu-layers", "8", "-m", "x"]
            );
        }
        assert_eq!(
            rewritten(&["rgml", "run", "-ngl=all"]),
            ["rgml", "run", "--n-gpu-layers=all"]
        );
        assert_eq!(
            rewritten(&["rgml", "quantize", "-ngl"]),
            ["rgml", "quantize", "-ngl"]
        );
    }

    #[test]
    fn values_are_never_rewritten() {
        // A prompt, a device list and a file that happen to read like the flags.
        assert_eq!(
            rewritten(&["rgml", "run", "-p", "-ngl", "--prompt", "-np", "-ngl", "2"]),
            [
                "rgml",
                "run",
                "-p",
                "-ngl",
                "--prompt",
                "-np",
                "--n-gpu-layers",
                "2"
            ]
        );
        assert_eq!(
            rewritten(&["rgml", "serve", "--alias", "-np", "-ngl", "-ngl"]),
            ["rgml", "serve", "--alias", "-np", "--n-gpu-layers", "-ngl"]
        );
        // A switch takes no value: the word after it is read as a flag.
        assert_eq!(
            rewritten(&["rgml", "logits", "--json", "-ngl", "1"]),
            ["rgml", "logits", "--json", "--n-gpu-layers", "1"]
        );
        assert_eq!(
            rewritten(&["rgml", "run", "--", "-ngl"]),
            ["rgml", "run", "--", "-ngl"]
        );
    }
}
