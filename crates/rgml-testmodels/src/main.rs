//! `rgml-random-model --arch NAME --out FILE [--vocab GGUF]`: writes the random model of one
//! architecture (see the `rgml_testmodels` library). The vocabulary defaults to the
//! architecture's file under `models/` of the current directory (the workspace root).

use rgml_testmodels::{write_random_model, Arch};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: rgml-random-model --arch NAME --out FILE [--vocab GGUF]\n\
                     NAME: gemma3, qwen2, qwen3, llama3 (or llama), phi3, mistral";

#[derive(Debug)]
struct Args {
    arch: Arch,
    out: PathBuf,
    vocab: PathBuf,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut arch, mut out, mut vocab) = (None, None, None);
    let mut args = args;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--arch" => arch = Some(value()?.parse::<Arch>().map_err(|e| e.to_string())?),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--vocab" => vocab = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let arch = arch.ok_or("--arch is required")?;
    Ok(Args {
        arch,
        out: out.ok_or("--out is required")?,
        vocab: vocab.unwrap_or_else(|| PathBuf::from(arch.vocab_file())),
    })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("rgml-random-model: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let start = Instant::now();
    match write_random_model(args.arch, &args.vocab, &args.out) {
        Ok(w) => {
            eprintln!(
                "{}: {} {} tensors, {} tokens, {} bytes in {:.2} s",
                args.out.display(),
                args.arch,
                w.n_tensors,
                w.n_vocab,
                w.bytes,
                start.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rgml-random-model: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_parse_and_the_vocabulary_defaults_to_the_architecture_s() {
        let a = args(&["--arch", "phi3", "--out", "x.gguf"]).unwrap();
        assert_eq!((a.arch, a.out), (Arch::Phi3, PathBuf::from("x.gguf")));
        assert_eq!(a.vocab, PathBuf::from(Arch::Phi3.vocab_file()));
        let b = args(&["--out", "y", "--vocab", "v.gguf", "--arch", "llama"]).unwrap();
        assert_eq!((b.arch, b.vocab), (Arch::Llama3, PathBuf::from("v.gguf")));
    }

    #[test]
    fn missing_or_unknown_arguments_are_errors() {
        assert!(args(&["--out", "x"]).unwrap_err().contains("--arch"));
        assert!(args(&["--arch", "qwen2"]).unwrap_err().contains("--out"));
        assert!(args(&["--arch"]).unwrap_err().contains("needs a value"));
        assert!(args(&["--arch", "bert"])
            .unwrap_err()
            .contains("unknown architecture"));
        assert!(args(&["--frob"]).unwrap_err().contains("unknown argument"));
    }
}
