use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::Arc;

fn matcher(gbnf: &str) -> Matcher {
    Matcher::new(Arc::new(Grammar::from_gbnf(gbnf).unwrap()))
}

/// Whether the whole of `text` is a sentence (and every prefix a prefix of one).
fn takes(gbnf: &str, text: &str) -> bool {
    let mut m = matcher(gbnf);
    text.bytes().all(|b| m.push(&[b])) && m.complete()
}

#[test]
fn gbnf_sentences_are_taken_and_others_refused() {
    let g = r#"
        # a list of small words
        root ::= "[" ws ( word ( "," ws word )* )? ws "]"
        word ::= [a-z]{1,3} | "\"" [^"\\\n]* "\"" | "\u00e9t\u00e9"
        ws   ::= [ \t]*
    "#;
    for ok in ["[]", "[ab]", "[ a,b,  cde ]", "[\"x y\"]", "[été,\"😀\"]"] {
        assert!(takes(g, ok), "{ok}");
    }
    for bad in [
        "[",
        "[abcd]",
        "[a,]",
        "[A]",
        "x",
        "[\"a\nb\"]",
        "[]]",
        "[ét]",
    ] {
        assert!(!takes(g, bad), "{bad}");
    }
}

#[test]
fn repetitions_count_as_llama_cpp_rewrites_them() {
    let g = "root ::= \"a\"{2} \"b\"{1,3} (\"c\" \"d\")+ \"e\"? \"f\"{2,}";
    assert!(takes(g, "aabcdff"));
    assert!(takes(g, "aabbbcdcdefff"));
    assert!(!takes(g, "abcdff"));
    assert!(!takes(g, "aabbbbcdff"));
    assert!(!takes(g, "aabff"));
    assert!(!takes(g, "aabcdef"));
    assert!(!takes(g, "aabcdcff_"));
}

#[test]
fn a_sentence_ends_only_where_the_grammar_does() {
    let mut m = matcher(r#"root ::= "ab" "c"?"#);
    assert!(!m.complete());
    assert!(m.push(b"ab"));
    assert!(m.complete() && !m.finished());
    assert!(!m.accepts(b"x") && !m.accepts(b""));
    assert!(m.push(b"c"));
    assert!(m.finished());
    assert!(!m.push(b"c"), "nothing may follow");
}

#[test]
fn characters_split_across_tokens_are_checked_by_their_first_bytes() {
    let mut m = matcher("root ::= [α-ω]+");
    let alpha = "α".as_bytes(); // 0xCE 0xB1
    assert!(m.accepts(&alpha[..1]));
    assert!(
        !m.accepts(&"Ж".as_bytes()[..1]),
        "0xD0 starts no Greek letter"
    );
    assert!(
        !m.accepts(&[0xB1]),
        "a continuation byte cannot start a character"
    );
    assert!(m.push(&alpha[..1]));
    assert!(!m.complete(), "half a character");
    assert!(m.push(&alpha[1..]));
    assert!(m.complete());
    let mut m = matcher("root ::= [^a]");
    assert!(m.push("😀".as_bytes()));
    assert!(m.finished());
}

#[test]
fn an_exponentially_ambiguous_grammar_is_refused_where_it_overflows() {
    // After n a's every one of the 2^n sequences of pending "b" and "c" is a stack.
    let g = "root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"";
    let mut m = matcher(g);
    let mut taken = 0;
    while taken < 40 && m.push(b"a") {
        assert!(!m.overflowed());
        taken += 1;
    }
    assert!(m.overflowed(), "{taken} a's taken");
    // About 3 * 2^n stacks after n a's: refused near log2(MAX_STACKS) of them.
    assert!((12..=16).contains(&taken), "{taken} a's taken");
    // What the grammar allows from here is still followed.
    assert!(m.push(b"bc") && !m.overflowed());
    // The JSON grammars stay far below the limit.
    let mut json = Matcher::new(Grammar::json_object());
    assert!(json.push(br#"{"a": [[[[{"b": [1, 2, {"c": "d"}]}]]]]}"#) && json.complete());
    assert!(!json.overflowed());
}

#[test]
fn long_texts_keep_the_parse_small() {
    // `x*` recurses on the right: its stack must not grow with the text.
    let mut m = matcher(r#"root ::= "\"" [a-z]* "\"""#);
    assert!(m.push(b"\""));
    for _ in 0..20_000 {
        assert!(m.push(b"abcdefgh"));
    }
    assert!(m.push(b"\""));
    assert!(m.finished());
}

#[test]
fn bad_grammars_are_errors_that_say_where() {
    let err = |g: &str| Grammar::from_gbnf(g).unwrap_err();
    assert_eq!(err("root ::= foo"), GrammarError::Undefined("foo".into()));
    assert_eq!(err("start ::= \"a\""), GrammarError::NoRoot);
    assert_eq!(
        err("root ::= root \"a\" | \"b\""),
        GrammarError::LeftRecursion("root".into())
    );
    assert_eq!(
        err("root ::= x? root\nx ::= \"a\""),
        GrammarError::LeftRecursion("root".into())
    );
    let GrammarError::Parse { line, col, what } = err("root ::= \"a\"\nb ::= \"\\q\"") else {
        panic!("a parse error");
    };
    assert_eq!((line, col), (2, 10));
    assert!(what.contains("\\q"), "{what}");
    assert!(matches!(err("root ::= \"abc"), GrammarError::Parse { .. }));
    assert!(matches!(err("root ::= [a-"), GrammarError::Parse { .. }));
    assert!(matches!(
        err("root ::= \"a\"{3,1}"),
        GrammarError::Parse { .. }
    ));
    assert!(
        matches!(err("root ::= <[1000]>"), GrammarError::Parse { what, .. } if what.contains("token"))
    );
    assert_eq!(
        err("root ::= \"a\"{99999999}"),
        GrammarError::TooLarge(MAX_TERMS)
    );
}

#[test]
fn token_tries_give_the_tokens_the_grammar_allows() {
    let vocab: Vec<&[u8]> = vec![
        b"{",
        b"}",
        b"{}",
        b"a",
        b"ab",
        b"b",
        b"",
        &[0xCE],
        &[0xB1],
        "α".as_bytes(),
    ];
    let trie = TokenTrie::new(vocab.iter().enumerate().map(|(i, t)| (i as u32, *t)));
    let mut m = matcher(r#"root ::= "{" [aα]* "}""#);
    let allowed = |m: &mut Matcher| {
        let mut out = Vec::new();
        m.allowed_tokens(&trie, |t| out.push(t));
        out.sort();
        out
    };
    assert_eq!(allowed(&mut m), vec![0, 2]);
    assert!(m.push(b"{"));
    assert_eq!(allowed(&mut m), vec![1, 3, 7, 9]);
    assert!(m.push(&[0xCE]));
    assert_eq!(allowed(&mut m), vec![8]);
    // Every token the walk allows is one `accepts` allows, and the other way round.
    for (i, text) in vocab.iter().enumerate() {
        let mut walk = Vec::new();
        m.allowed_tokens(&trie, |t| walk.push(t));
        assert_eq!(walk.contains(&(i as u32)), m.accepts(text), "token {i}");
    }
}

/// Random texts of `grammar`: a walk choosing among the characters it allows next (from a
/// mix of JSON's punctuation, letters, digits and a few wider ones), stopping at random once
/// complete.
fn random_sentences(grammar: &Arc<Grammar>, n: usize, seed: u64) -> Vec<String> {
    let alphabet: Vec<char> = "{}[],:\" \n\t-+.eE0123456789abcdefghijklmnopqrstuvwxyzAFTZ\\é😀"
        .chars()
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut tries = 0;
    while out.len() < n && tries < 50 * n {
        tries += 1;
        let mut m = Matcher::new(grammar.clone());
        let mut text = String::new();
        while text.len() < 600 {
            if m.finished() || (m.complete() && rng.gen_bool(0.3)) {
                break;
            }
            let options: Vec<char> = (alphabet.iter().copied())
                .filter(|c| m.accepts(c.encode_utf8(&mut [0; 4]).as_bytes()))
                .collect();
            if options.is_empty() {
                break;
            }
            // Closing and quoting characters more often, so texts end.
            let weights: Vec<f64> = (options.iter())
                .map(|c| if "}]\",".contains(*c) { 6.0 } else { 1.0 })
                .collect();
            let total: f64 = weights.iter().sum();
            let mut x = rng.gen_range(0.0..total);
            let mut pick = options[0];
            for (c, w) in options.iter().zip(&weights) {
                pick = *c;
                if x < *w {
                    break;
                }
                x -= w;
            }
            assert!(m.push(pick.encode_utf8(&mut [0; 4]).as_bytes()));
            text.push(pick);
        }
        if m.complete() {
            out.push(text);
        }
    }
    out
}

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object"}),
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "score": {"type": "integer", "exclusiveMinimum": -20, "maximum": 3},
                "tags": {"type": "array", "items": {"enum": ["a", "b", 3, null]}, "minItems": 1, "maxItems": 3},
                "when": {"type": "string", "format": "date"},
                "id": {"type": "string", "format": "uuid"},
                "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "number"}]},
                "ok": {"const": true},
                "kind": {"type": ["string", "null"], "maxLength": 2},
            },
            "required": ["name", "age"],
            "additionalProperties": false,
        }),
        json!({
            "$defs": {"node": {"type": "object", "properties": {
                "v": {"type": "integer"},
                "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
            }, "required": ["v", "next"]}},
            "$ref": "#/$defs/node",
        }),
        json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "ab": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        }),
        json!({"type": "array", "items": {"type": "object", "properties": {"x": {"type": "boolean"}}}}),
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
                "word": {"pattern": "a(b|c)+"},
                "odd": {"type": "string", "pattern": "^[^x]\"?\\.(?:\\s|[\\\\q\\n]){0,2}$"},
            },
            "required": ["code", "word", "odd"],
        }),
        json!({
            "$defs": {"named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
            "allOf": [
                {"$ref": "#/$defs/named"},
                {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}, "required": ["age"]},
                {"anyOf": [{"properties": {"nick": {"type": "string"}}}]},
            ],
        }),
        json!({
            "type": "object",
            "properties": {
                "price": {"type": "number", "minimum": 0, "exclusiveMaximum": 100.5},
                "temp": {"type": "number", "minimum": -40.25, "maximum": -0.5},
                "ratio": {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "n": {"type": ["number", "null"], "maximum": 7.125},
            },
            "required": ["price", "temp", "ratio", "n"],
        }),
    ]
}

#[test]
fn every_text_a_schema_grammar_allows_validates_against_the_schema() {
    for (i, schema) in schemas().into_iter().enumerate() {
        let gbnf = schema::to_gbnf(&schema).unwrap();
        let grammar = Arc::new(Grammar::from_gbnf(&gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}")));
        let validator = jsonschema::validator_for(&schema).unwrap();
        let texts = random_sentences(&grammar, 40, i as u64);
        assert!(
            texts.len() >= 20,
            "schema {i}: only {} texts\n{gbnf}",
            texts.len()
        );
        for text in texts {
            let doc: Value = match serde_json::from_str(&text) {
                Ok(doc) => doc,
                // JSON allows exponents past f64's range; serde_json does not.
                Err(e) if e.to_string().contains("number out of range") => continue,
                Err(e) => panic!("{e}: {text}"),
            };
            assert!(validator.is_valid(&doc), "schema {i}: {text}\n{gbnf}");
        }
    }
}

#[test]
fn schema_grammars_take_valid_documents_and_refuse_invalid_ones() {
    let schema = &schemas()[1];
    let grammar = Arc::new(Grammar::from_json_schema(schema).unwrap());
    let ok = |text: &str| {
        let mut m = Matcher::new(grammar.clone());
        m.push(text.as_bytes()) && m.complete()
    };
    assert!(ok(r#"{"name": "Al", "age": 120}"#));
    assert!(ok(
        r#"{"name": "Al", "age": 7, "score": -19, "tags": ["a", 3, null], "ok": true}"#
    ));
    assert!(ok(
        r#"{"name": "Al", "age": 0, "when": "2026-11-28", "kind": null}"#
    ));
    assert!(
        !ok(r#"{"age": 7, "name": "Al"}"#),
        "required ones first, in order"
    );
    assert!(!ok(r#"{"name": "", "age": 7}"#), "minLength");
    assert!(!ok(r#"{"name": "Al", "age": 121}"#), "maximum");
    assert!(!ok(r#"{"name": "Al", "age": 07}"#), "leading zero");
    assert!(
        !ok(r#"{"name": "Al", "age": 1, "score": -20}"#),
        "exclusiveMinimum"
    );
    let patterned = Arc::new(Grammar::from_json_schema(&schemas()[5]).unwrap());
    let ok = |text: &str| {
        let mut m = Matcher::new(patterned.clone());
        m.push(text.as_bytes()) && m.complete()
    };
    assert!(ok(
        r#"{"code": "AB-123", "word": "xxabcb", "odd": "y\".\\\n"}"#
    ));
    assert!(
        !ok(r#"{"code": "AB-12", "word": "ab", "odd": "y."}"#),
        "{{3}}"
    );
    assert!(!ok(r#"{"code": "AB-123", "word": "a", "odd": "y."}"#), "+");
    assert!(
        !ok(r#"{"code": "AB-123", "word": "ab", "odd": "x."}"#),
        "[^x]"
    );
    let merged = Arc::new(Grammar::from_json_schema(&schemas()[6]).unwrap());
    let ok = |text: &str| {
        let mut m = Matcher::new(merged.clone());
        m.push(text.as_bytes()) && m.complete()
    };
    assert!(ok(r#"{"name": "Al", "age": 3}"#));
    assert!(ok(r#"{"name": "Al", "age": 3, "nick": "A"}"#));
    assert!(!ok(r#"{"name": "Al"}"#), "both parts' required");
    assert!(!ok(r#"{"name": "Al", "age": -1}"#), "a part's bounds");
    assert!(
        !ok(r#"{"name": "Al", "age": 1, "extra": 1}"#),
        "additionalProperties false"
    );
    assert!(!ok(r#"{"name": "Al", "age": 1, "tags": []}"#), "minItems");
    assert!(
        !ok(r#"{"name": "Al", "age": 1, "kind": "abc"}"#),
        "maxLength in a type list"
    );
    // Additional properties may not take a declared name.
    let grammar = Arc::new(Grammar::from_json_schema(&schemas()[3]).unwrap());
    let ok = |text: &str| {
        let mut m = Matcher::new(grammar.clone());
        m.push(text.as_bytes()) && m.complete()
    };
    assert!(ok(r#"{"a": 1.5, "b": 2, "abc": 3, "": 4}"#));
    assert!(!ok(r#"{"a": 1.5, "ab": 2}"#), "`ab` is declared a string");
    assert!(!ok(r#"{"x": 1, "a": 2}"#), "declared ones come first");
}

#[test]
fn integer_ranges_hold_exactly_their_numbers() {
    for (lo, hi) in [
        (Some(0), Some(120)),
        (Some(-37), Some(5)),
        (Some(-250), Some(-17)),
        (Some(95), None),
        (None, Some(-3)),
        (Some(7), Some(7)),
    ] {
        let mut schema = json!({"type": "integer"});
        if let Some(lo) = lo {
            schema["minimum"] = json!(lo);
        }
        if let Some(hi) = hi {
            schema["maximum"] = json!(hi);
        }
        let grammar = Arc::new(Grammar::from_json_schema(&schema).unwrap());
        for n in -400i64..400 {
            let mut m = Matcher::new(grammar.clone());
            let taken = m.push(n.to_string().as_bytes()) && m.complete();
            let inside = lo.is_none_or(|lo| n >= lo) && hi.is_none_or(|hi| n <= hi);
            assert_eq!(taken, inside, "{n} in {lo:?}..={hi:?}");
        }
    }
}

/// A decimal text's value times 10^8 (at most 8 fraction digits).
fn scaled(text: &str) -> i128 {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let frac = format!("{frac:0<8}");
    let v = int.parse::<i128>().unwrap() * 100_000_000 + frac.parse::<i128>().unwrap();
    if neg {
        -v
    } else {
        v
    }
}

#[test]
fn number_ranges_hold_exactly_their_numbers() {
    // (keyword, bound) pairs: JSON numbers as their source text.
    let cases: &[&[(&str, &str)]] = &[
        &[("minimum", "1.5"), ("maximum", "2.25")],
        &[("exclusiveMinimum", "1.5"), ("exclusiveMaximum", "2.25")],
        &[("exclusiveMinimum", "-2.5"), ("maximum", "-0.25")],
        &[("minimum", "-1.75"), ("maximum", "3")],
        &[("exclusiveMinimum", "0")],
        &[("minimum", "0")],
        &[("exclusiveMaximum", "0")],
        &[("maximum", "0")],
        &[("minimum", "0.5"), ("maximum", "0.5")],
        &[("minimum", "-0.005"), ("exclusiveMaximum", "0.005")],
        &[("minimum", "-7"), ("exclusiveMaximum", "-2")],
        &[("minimum", "10"), ("exclusiveMaximum", "20")],
        &[
            ("minimum", "1.5"),
            ("exclusiveMinimum", "1.25"),
            ("maximum", "99.99"),
        ],
        &[("exclusiveMinimum", "1.5"), ("minimum", "1.5")],
        &[("maximum", "-12.0625")],
        &[("exclusiveMinimum", "0.0999")],
    ];
    let fractions = [
        "", "0", "00", "5", "05", "25", "250", "2501", "2499", "4999", "5001", "75", "999", "0001",
        "1", "0625", "06249", "0626", "0999", "1",
    ];
    let mut texts = Vec::new();
    for int in -25i32..=25 {
        for frac in fractions {
            let int_text = match int {
                0 => "0".to_string(),
                _ => int.abs().to_string(),
            };
            let sign = if int < 0 { "-" } else { "" };
            let text = match frac {
                "" => format!("{sign}{int_text}"),
                f => format!("{sign}{int_text}.{f}"),
            };
            texts.push(text.clone());
            if int == 0 && !frac.trim_matches('0').is_empty() {
                texts.push(format!("-{text}"));
            }
        }
    }
    texts.extend(
        [
            "-12.0625",
            "-12.06251",
            "-12.0624",
            "99.99",
            "99.991",
            "100",
        ]
        .map(String::from),
    );
    for case in cases {
        let mut schema = json!({"type": "number"});
        for (key, value) in case.iter() {
            schema[*key] = serde_json::from_str(value).unwrap();
        }
        let grammar = Arc::new(Grammar::from_json_schema(&schema).unwrap());
        let bound = |key: &str| case.iter().find(|(k, _)| *k == key).map(|(_, v)| scaled(v));
        let mut inside_count = 0;
        for text in &texts {
            let x = scaled(text);
            let inside = bound("minimum").is_none_or(|b| x >= b)
                && bound("exclusiveMinimum").is_none_or(|b| x > b)
                && bound("maximum").is_none_or(|b| x <= b)
                && bound("exclusiveMaximum").is_none_or(|b| x < b);
            let mut m = Matcher::new(grammar.clone());
            let taken = m.push(text.as_bytes()) && m.complete();
            assert_eq!(taken, inside, "{text} under {schema}");
            inside_count += usize::from(inside);
        }
        assert!(inside_count > 0, "{schema}");
        // Negative zero is a zero the grammar writes as "0" only; exponents are not written.
        for text in ["-0", "-0.0", "1e0", "1.5E+0"] {
            let mut m = Matcher::new(grammar.clone());
            assert!(
                !(m.push(text.as_bytes()) && m.complete()),
                "{text} under {schema}"
            );
        }
    }
}

#[test]
fn unsupported_schemas_are_refused_by_name() {
    let refused = |schema: Value, word: &str| {
        let err = Grammar::from_json_schema(&schema).unwrap_err().to_string();
        assert!(err.contains(word), "{err} should name {word}");
    };
    refused(json!({"type": "string", "pattern": "^(?=a)"}), "lookaround");
    refused(
        json!({"type": "string", "pattern": "(a)\\1"}),
        "backreference",
    );
    refused(
        json!({"type": "string", "pattern": "a", "maxLength": 3}),
        "pattern",
    );
    refused(json!({"type": "number", "minimum": 1e-40}), "decimals");
    refused(
        json!({"type": "number", "exclusiveMinimum": true}),
        "exclusiveMinimum",
    );
    refused(
        json!({"type": "number", "minimum": 2, "exclusiveMaximum": 2}),
        "no value",
    );
    refused(
        json!({"type": "object", "minProperties": 1}),
        "minProperties",
    );
    refused(json!({"allOf": [{"type": "string"}]}), "allOf");
    refused(
        json!({"allOf": [{"type": "object"}], "minProperties": 1}),
        "minProperties",
    );
    refused(json!({"type": "strin"}), "strin");
    refused(json!({"type": "string", "format": "email"}), "email");
    refused(json!({"$ref": "#/$defs/missing"}), "missing");
    refused(
        json!({"$ref": "https://example.com/s.json"}),
        "https://example.com",
    );
    refused(
        json!({"type": "object", "properties": {}, "required": ["a"]}),
        "`a`",
    );
    refused(json!({"enum": []}), "enum");
    refused(json!(3), "object or a boolean");
}

#[test]
fn ill_formed_utf8_is_refused_even_where_the_class_would_match() {
    for bytes in [
        &[0xC1, 0x81][..],         // overlong 'A'
        &[0xE0, 0x81, 0x81],       // overlong 'A'
        &[0xE0, 0x9F],             // overlong, caught at the second byte
        &[0xED, 0xA0, 0x80],       // a surrogate
        &[0xF4, 0x90, 0x80, 0x80], // past U+10FFFF
        &[0xF8, 0x80],
        &[0xE2, 0x82, 0x41], // a lead byte where a continuation must come
    ] {
        let mut m = matcher("root ::= [^\"]*");
        assert!(!m.push(bytes), "{bytes:x?}");
    }
    let mut m = matcher("root ::= [^\"]*");
    assert!(m.push("€\u{10FFFF}\u{D7FF}\u{E000}".as_bytes()));
}

#[test]
fn the_json_object_grammar_takes_objects_only() {
    let grammar = Grammar::json_object();
    let takes = |text: &str| {
        let mut m = Matcher::new(grammar.clone());
        m.push(text.as_bytes()) && m.finished()
    };
    assert!(takes(r#"{"a": [1, {"b": null}], "c": "\u00e9"}"#));
    assert!(takes("{}"));
    for bad in ["[1]", "1", "{a: 1}", "{\"a\": 1,}", "{} {}", "{\"a\": 01}"] {
        assert!(!takes(bad), "{bad}");
    }
}

#[test]
fn framed_documents_hold_the_frame_and_each_schema() {
    let weather =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let nested = json!({"$defs": {"x": {"type": "integer"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/x"}}});
    let other = json!({"$defs": {"x": {"type": "boolean"}}, "type": "object", "properties": {"b": {"$ref": "#/$defs/x"}}});
    // Refused (a `pattern` after a property the converter had already written): any object.
    let patterned = json!({"type": "object", "properties": {"a": {"type": "integer"}, "z": {"type": "string", "pattern": "^(?!x)"}}});
    let frames = [
        schema::Framed {
            prefix: "<call weather>",
            schema: Some(&weather),
            suffix: "</call>",
        },
        schema::Framed {
            prefix: "<call n>",
            schema: Some(&nested),
            suffix: "</call>",
        },
        schema::Framed {
            prefix: "<call b>",
            schema: Some(&other),
            suffix: "</call>",
        },
        schema::Framed {
            prefix: "<call any>",
            schema: None,
            suffix: "</call>",
        },
        schema::Framed {
            prefix: "<call p>",
            schema: Some(&patterned),
            suffix: "</call>",
        },
    ];
    let (gbnf, refused) = schema::framed_to_gbnf(&frames).unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, 4);
    assert!(refused[0].1.to_string().contains("pattern"));
    let grammar = Arc::new(Grammar::from_gbnf(&gbnf).unwrap());
    let takes = |text: &str| {
        let mut m = Matcher::new(grammar.clone());
        m.push(text.as_bytes()) && m.finished()
    };
    assert!(takes(r#"<call weather>{"city": "Oslo"}</call>"#));
    assert!(takes(r#"<call n>{"n": 3}</call>"#));
    assert!(
        takes(r#"<call b>{"b": true}</call>"#),
        "each schema's $defs are its own"
    );
    assert!(takes(r#"<call any>{"x": [1]}</call>"#));
    assert!(takes(r#"<call p>{"q": "any"}</call>"#));
    assert!(!takes(r#"<call weather>{}</call>"#));
    assert!(!takes(r#"<call n>{"n": true}</call>"#));
    assert!(!takes(r#"<call b>{"b": 3}</call>"#));
    assert!(!takes(r#"<call any>[1]</call>"#));
    assert!(!takes(r#"<call weather>{"city": "Oslo"}"#));
}

#[test]
fn long_chains_of_empty_matches_expand_without_deep_recursion() {
    // 3 000 nested optional rules, each able to match nothing: expanded on a work list
    // (recursion this deep would overflow a thread's stack).
    let text = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let mut m = matcher("root ::= (\"a\"?){0,3000} \"b\"");
            let ok = m.push(b"aaab") && m.finished();
            let mut m = matcher("root ::= (\"a\"?){0,3000} \"b\"");
            ok && !m.push(b"c")
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(text);
}

#[test]
fn chat_answers_are_the_document_bare_or_fenced_after_any_reasoning() {
    use schema::{answer_to_gbnf, AnswerReasoning};
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let plain = answer_to_gbnf(&schema, AnswerReasoning::None).unwrap();
    let may = answer_to_gbnf(&schema, AnswerReasoning::May).unwrap();
    let open = answer_to_gbnf(&schema, AnswerReasoning::Open).unwrap();
    let documents = [
        "{\"a\": 1}",
        " {\"a\": 2} ",
        "\n{\"a\": 3}\n",
        "```json\n{\"a\": 4}\n```",
        "\n```json {\"a\": 5}```",
    ];
    for doc in documents {
        assert!(takes(&plain, doc), "{doc:?}");
        assert!(takes(&may, doc), "{doc:?}");
        assert!(!takes(&open, doc), "{doc:?}");
        let thought = format!("<think>\nA < B, </thin k> </think\n</think>\n\n{doc}");
        assert!(!takes(&plain, &thought), "{thought:?}");
        assert!(takes(&may, &thought), "{thought:?}");
        let rest = thought.trim_start_matches("<think>");
        assert!(takes(&open, rest), "{rest:?}");
    }
    for bad in [
        "{\"a\": \"x\"}",
        "{\"a\": 1} x",
        "```{\"a\": 1}```",
        "```json {\"a\": 1}",
        "{\"a\": 1}```",
        "```json\n{\"a\": 1}\n``` ",
    ] {
        assert!(!takes(&plain, bad), "{bad:?}");
        assert!(!takes(&may, bad), "{bad:?}");
    }
    // The reasoning ends at its first `</think>`; then at most six newlines (two after the
    // tag, two in each of the two `space`s before a bare document).
    for bad in [
        "<think>a</think>b</think>{\"a\": 1}",
        "<think>a</think>\n\n\n\n\n\n\n{\"a\": 1}",
        "<think>a{\"a\": 1}",
    ] {
        assert!(!takes(&may, bad), "{bad:?}");
    }
    let unclosed = "<think>still thinking </think";
    let mut m = matcher(&may);
    assert!(unclosed.bytes().all(|b| m.push(&[b])) && !m.complete());
}

#[test]
fn text_without_a_delimiter_is_any_text_but_the_delimiter() {
    // A delimiter that overlaps itself: after "abab", "c" would complete "ababc".
    let gbnf = schema::excluding_then_bang("ababc");
    for ok in ["!", "abab!", "ababab!", "abac!", "ababd ababa!", "cbabcab!"] {
        assert!(takes(&gbnf, ok), "{ok}");
    }
    for bad in ["ababc!", "xababcx!", "abababc!"] {
        assert!(!takes(&gbnf, bad), "{bad}");
    }
}
