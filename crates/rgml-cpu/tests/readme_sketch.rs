//! The README's core library sketch is the crate docs' copy, which rustdoc compiles and runs.

use std::path::PathBuf;

/// The lines of the first ```rust block after `marker`, fences and rustdoc's hidden lines
/// (`# ...`) left out, each with its `prefix` removed.
fn sketch(text: &str, marker: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            l.strip_prefix(prefix)
                .or_else(|| l.strip_prefix(prefix.trim_end()))
                .unwrap_or(l)
                .trim_end()
        })
        .skip_while(|l| !l.contains(marker))
        .skip_while(|l| !l.starts_with("```rust"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.starts_with("# ") && !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_readme_sketch_is_the_compiled_one() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../../README.md")).expect("README.md");
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("lib.rs");
    let in_readme = sketch(&readme, "## Library sketch", "");
    let in_docs = sketch(&lib, "library sketch", "//! ");
    assert!(in_readme.len() > 5, "{in_readme:?}");
    assert_eq!(in_readme, in_docs);
}
