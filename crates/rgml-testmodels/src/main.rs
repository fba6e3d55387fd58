//! `rgml-random-model`: writes a random-weight model (see the `rgml_testmodels` library), one
//! of two kinds:
//!
//! - `--arch NAME --out FILE [--vocab GGUF]`: the tiny model of one architecture, byte for
//!   byte the same every time (the logits fixtures depend on it);
//! - `--shape NAME --type TYPE --out FILE [--vocab GGUF] [--seed N] [--experts N]`: a real
//!   model's shape in a `llama-quantize` file type, for benchmarks (`--experts`: a
//!   mixture-of-experts shape with fewer experts of the same width).
//!
//! The vocabulary defaults to the architecture's or shape's file under `models/` of the
//! current directory (the workspace root).

use rgml_testmodels::{write_random_model, write_shape_spec, Arch, QuantPreset, Shape};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

fn usage() -> String {
    let arches: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
    format!(
        "usage: rgml-random-model --arch NAME --out FILE [--vocab GGUF]\n\
         \x20      rgml-random-model --shape SHAPE --type TYPE --out FILE [--vocab GGUF] [--seed N]\n\
         \x20                        [--experts N]\n\
         \n\
         --arch NAME    a tiny model of an architecture (always the same bytes):\n\
         \x20              {} (llama = llama3)\n\
         --shape SHAPE  a real model's shape with random weights, for benchmarks:\n\
         \x20              {}\n\
         --type TYPE    llama-quantize's file type (its per-tensor types), with --shape:\n\
         \x20              {}\n\
         --out FILE     the model to write (under FILE.part until complete)\n\
         --vocab GGUF   the GGUF file whose vocabulary and tokenizer.* keys are copied\n\
         \x20              (default: the architecture's or shape's file under models/)\n\
         --seed N       the random values of a --shape model (default 0)\n\
         --experts N    a mixture-of-experts shape with N experts per block instead of the\n\
         \x20              real count (as wide, as many used per token: the same work per\n\
         \x20              token in a smaller file)",
        arches.join(", "),
        Shape::names(),
        QuantPreset::names(),
    )
}

/// What to write.
#[derive(Debug, PartialEq)]
enum Kind {
    /// A tiny `--arch` model.
    Arch(Arch),
    /// A `--shape` model.
    Shape {
        shape: Shape,
        preset: QuantPreset,
        seed: u64,
        /// `--experts`: the expert count in place of the shape's.
        experts: Option<usize>,
    },
}

#[derive(Debug)]
struct Args {
    kind: Kind,
    out: PathBuf,
    vocab: PathBuf,
}

/// Why the arguments were not taken.
#[derive(Debug, PartialEq)]
enum Usage {
    /// `--help`.
    Help,
    /// A mistake, described.
    Error(String),
}

impl From<&str> for Usage {
    fn from(s: &str) -> Usage {
        Usage::Error(s.to_string())
    }
}

impl From<String> for Usage {
    fn from(s: String) -> Usage {
        Usage::Error(s)
    }
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args, Usage> {
    let (mut arch, mut shape, mut preset, mut seed) = (None, None, None, None);
    let mut experts = None;
    let (mut out, mut vocab) = (None, None);
    let mut args = args;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--arch" => arch = Some(value()?.parse::<Arch>().map_err(|e| e.to_string())?),
            "--shape" => shape = Some(value()?.parse::<Shape>().map_err(|e| e.to_string())?),
            "--type" => preset = Some(QuantPreset::parse(&value()?).map_err(|e| e.to_string())?),
            "--seed" => {
                let v = value()?;
                let n = v.parse::<u64>().map_err(|_| {
                    format!(
                        "--seed takes a whole number from 0 to {}, not {v:?}",
                        u64::MAX
                    )
                })?;
                seed = Some(n);
            }
            "--experts" => {
                let v = value()?;
                let n = v.parse::<usize>().ok().filter(|&n| n > 0);
                experts = Some(n.ok_or(format!("--experts takes a positive count, not {v:?}"))?);
            }
            "--out" => out = Some(PathBuf::from(value()?)),
            "--vocab" => vocab = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(Usage::Help),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let (kind, default_vocab) = match (arch, shape) {
        (Some(_), Some(_)) => return Err("--arch and --shape exclude each other".into()),
        (None, None) => return Err("--arch or --shape is required".into()),
        (Some(arch), None) => {
            if preset.is_some() || seed.is_some() || experts.is_some() {
                return Err("--type, --seed and --experts go with --shape, not --arch".into());
            }
            (Kind::Arch(arch), arch.vocab_file())
        }
        (None, Some(shape)) => {
            let preset = preset.ok_or_else(|| {
                format!("--shape needs --type (one of: {})", QuantPreset::names())
            })?;
            let seed = seed.unwrap_or(0);
            if let Some(n) = experts.filter(|&n| shape.spec_with_experts(n).is_none()) {
                return Err(format!(
                    "--experts {n}: {shape} has no experts, or uses more per token"
                )
                .into());
            }
            (
                Kind::Shape {
                    shape,
                    preset,
                    seed,
                    experts,
                },
                shape.vocab_file(),
            )
        }
    };
    Ok(Args {
        kind,
        out: out.ok_or("--out is required")?,
        vocab: vocab.unwrap_or_else(|| PathBuf::from(default_vocab)),
    })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(Usage::Help) => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(Usage::Error(e)) => {
            eprintln!("rgml-random-model: {e}\n{}", usage());
            return ExitCode::from(2);
        }
    };
    let start = Instant::now();
    let (what, written) = match args.kind {
        Kind::Arch(arch) => (
            arch.to_string(),
            write_random_model(arch, &args.vocab, &args.out),
        ),
        Kind::Shape {
            shape,
            preset,
            seed,
            experts,
        } => {
            // Checked when parsed.
            let spec = experts.and_then(|n| shape.spec_with_experts(n));
            let spec = spec.unwrap_or_else(|| shape.spec());
            let with = experts.map_or(String::new(), |n| format!(", {n} experts"));
            (
                format!("{shape}{with} {preset} seed {seed}"),
                write_shape_spec(shape, &spec, preset, seed, &args.vocab, &args.out),
            )
        }
    };
    match written {
        Ok(w) => {
            let seconds = start.elapsed().as_secs_f64();
            eprintln!(
                "{}: {what}, {} tensors, {} tokens, {} bytes in {seconds:.2} s ({:.2} GB/s)",
                args.out.display(),
                w.n_tensors,
                w.n_vocab,
                w.bytes,
                w.bytes as f64 / seconds.max(1e-9) / 1e9,
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

    fn args(list: &[&str]) -> Result<Args, Usage> {
        parse(list.iter().map(|s| s.to_string()))
    }

    fn error(list: &[&str]) -> String {
        match args(list) {
            Err(Usage::Error(e)) => e,
            other => panic!("{list:?}: expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn flags_parse_and_the_vocabulary_defaults_to_the_architecture_s() {
        let a = args(&["--arch", "phi3", "--out", "x.gguf"]).unwrap();
        assert_eq!(
            (a.kind, a.out),
            (Kind::Arch(Arch::Phi3), PathBuf::from("x.gguf"))
        );
        assert_eq!(a.vocab, PathBuf::from(Arch::Phi3.vocab_file()));
        let b = args(&["--out", "y", "--vocab", "v.gguf", "--arch", "llama"]).unwrap();
        assert_eq!(
            (b.kind, b.vocab),
            (Kind::Arch(Arch::Llama3), PathBuf::from("v.gguf"))
        );
    }

    #[test]
    fn shape_flags_parse_with_their_defaults() {
        let a = args(&["--shape", "llama-8b", "--type", "q4_k_m", "--out", "m.gguf"]).unwrap();
        let want = Kind::Shape {
            shape: Shape::Llama8B,
            preset: QuantPreset::Q4_K_M,
            seed: 0,
            experts: None,
        };
        assert_eq!(a.kind, want);
        assert_eq!(a.vocab, PathBuf::from(Shape::Llama8B.vocab_file()));
        let b = args(&[
            "--type",
            "Q8_0",
            "--seed",
            "42",
            "--vocab",
            "v.gguf",
            "--out",
            "m",
            "--shape",
            "smollm2-135m",
        ])
        .unwrap();
        let want = Kind::Shape {
            shape: Shape::SmolLM2_135M,
            preset: QuantPreset::Q8_0,
            seed: 42,
            experts: None,
        };
        assert_eq!((b.kind, b.vocab), (want, PathBuf::from("v.gguf")));
        assert_eq!(
            Shape::SmolLM2_135M.vocab_file(),
            "models/SmolLM2-135M-Instruct.Q4_1.gguf"
        );
    }

    #[test]
    fn missing_or_unknown_arguments_are_errors() {
        assert!(error(&["--out", "x"]).contains("--arch"));
        assert!(error(&["--arch", "qwen2"]).contains("--out"));
        assert!(error(&["--arch"]).contains("needs a value"));
        assert!(error(&["--arch", "roberta"]).contains("unknown architecture"));
        assert!(error(&["--frob"]).contains("unknown argument"));
        assert_eq!(args(&["--help"]).unwrap_err(), Usage::Help);
    }

    #[test]
    fn experts_go_with_mixture_of_experts_shapes_only() {
        let a = args(&[
            "--shape",
            "qwen3moe-30b-a3b",
            "--type",
            "Q4_K_M",
            "--experts",
            "64",
            "--out",
            "m",
        ])
        .unwrap();
        assert!(matches!(
            a.kind,
            Kind::Shape {
                experts: Some(64),
                ..
            }
        ));
        let e = error(&[
            "--shape",
            "llama-1b",
            "--type",
            "Q8_0",
            "--experts",
            "8",
            "--out",
            "x",
        ]);
        assert!(e.contains("--experts 8") && e.contains("no experts"), "{e}");
        let e = error(&[
            "--shape",
            "qwen3moe-30b-a3b",
            "--type",
            "Q8_0",
            "--experts",
            "4",
            "--out",
            "x",
        ]);
        assert!(e.contains("uses more per token"), "{e}");
        let e = error(&["--arch", "qwen3moe", "--experts", "4", "--out", "x"]);
        assert!(e.contains("--experts go with --shape"), "{e}");
    }

    #[test]
    fn shape_mistakes_are_errors_that_list_what_is_accepted() {
        let e = error(&["--shape", "llama-70b", "--type", "Q8_0", "--out", "x"]);
        assert!(e.contains("unknown shape") && e.contains("qwen-7b"), "{e}");
        let e = error(&["--shape", "llama-1b", "--type", "Q9_9", "--out", "x"]);
        assert!(
            e.contains("Q9_9") && e.contains("Q4_K_M") && e.contains("IQ4_XS"),
            "{e}"
        );
        let e = error(&["--shape", "llama-1b", "--out", "x"]);
        assert!(e.contains("--type") && e.contains("Q5_K_S"), "{e}");
        let e = error(&["--shape", "llama-1b", "--arch", "qwen2", "--type", "F16"]);
        assert!(e.contains("exclude"), "{e}");
        let e = error(&["--arch", "qwen2", "--type", "F16", "--out", "x"]);
        assert!(e.contains("--shape"), "{e}");
        let e = error(&["--arch", "qwen2", "--seed", "1", "--out", "x"]);
        assert!(e.contains("--shape"), "{e}");
        let e = error(&["--shape", "llama-1b", "--type", "F16", "--seed", "-1"]);
        assert!(e.contains("--seed") && e.contains("\"-1\""), "{e}");
    }

    #[test]
    fn the_usage_lists_every_shape_and_type() {
        let u = usage();
        for shape in Shape::ALL {
            assert!(u.contains(shape.name()), "{shape}");
        }
        for preset in QuantPreset::ALL {
            assert!(u.contains(preset.name()), "{preset}");
        }
    }
}
