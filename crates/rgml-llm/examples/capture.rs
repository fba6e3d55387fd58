//! Dump the intermediate tensors of one prompt evaluation, named as llama.cpp names them, to
//! compare with a llama.cpp `cb_eval` dump.
//!
//! `cargo run --release -p rgml-llm --example capture -- MODEL PROMPT OUT_DIR`
//!
//! Writes `OUT_DIR/index.json` (`[{"name", "ne", "file"}]`) and one little-endian f32 file per
//! tensor (`ne[0]` innermost), plus `logits.f32` for the last token.

use rgml_llm::session::{Logits, Session, SessionOptions};
use rgml_llm::{EncodeOptions, LoadOptions, Model};
use std::io::Write;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model, prompt, out] = &args[..] else {
        return Err("usage: capture MODEL PROMPT OUT_DIR".into());
    };
    rgml_cpu::register();
    let model = Arc::new(Model::load(model, LoadOptions::default())?);
    let tokens = model.tokenizer.encode(prompt, EncodeOptions::prompt());
    let mut session = Session::new(model.clone(), &SessionOptions::default())?;
    session.set_capture(true);
    let logits = session.eval(&tokens, Logits::Last)?;
    std::fs::create_dir_all(out)?;
    let write = |file: &str, data: &[f32]| -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(format!("{out}/{file}"))?);
        for v in data {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()
    };
    let mut index = Vec::new();
    for (i, c) in session.captured().iter().enumerate() {
        let file = format!("{i:04}.f32");
        write(&file, &c.data)?;
        index.push(serde_json::json!({"name": c.name, "ne": c.ne, "file": file}));
    }
    write("logits.f32", &logits)?;
    std::fs::write(format!("{out}/index.json"), serde_json::to_string(&index)?)?;
    println!("tokens {tokens:?}; {} tensors", index.len());
    Ok(())
}
