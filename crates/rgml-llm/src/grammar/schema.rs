//! A JSON Schema turned into GBNF text whose sentences are JSON documents valid under it, in
//! the manner of llama.cpp's `json_schema_to_grammar` (the same rule layout: required
//! properties in order, then optional ones in order, bounded whitespace).
//!
//! Taken: `type` (one or a list), `properties`, `required`, `additionalProperties`, `items`,
//! `prefixItems`, `minItems`, `maxItems`, `minLength`, `maxLength`, `pattern` (see
//! `grammar::pattern`), `format` (`date`, `time`, `date-time`, `uuid`), `enum`, `const`, `anyOf`, `oneOf` (as `anyOf`), `allOf` of objects
//! (merged as llama.cpp merges them), `$ref` into `$defs`
//! or `definitions` (recursion allowed), and integer and number bounds (`minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum`; see `grammar::numeric`). Annotations (`title`, `description`, `default`,
//! `examples`, ...) are read past. Any other keyword is refused by name: a schema we cannot
//! enforce is an error, not a weaker constraint.

use super::numeric::{decimal_range, int_range, split_decimal, MAX_FRACTION};
use super::GrammarError;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// The GBNF text of `schema`'s documents.
pub fn to_gbnf(schema: &Value) -> Result<String, GrammarError> {
    let mut c = Converter::new(schema, "");
    let top = c.visit(schema, "root")?;
    if top != "root" {
        c.add("root", &top);
    }
    Ok(c.text())
}

/// A document between fixed texts: one alternative of [`framed_to_gbnf`].
pub struct Framed<'a> {
    /// The text before the document.
    pub prefix: &'a str,
    /// The document's schema; `None`: any JSON object.
    pub schema: Option<&'a Value>,
    /// The text after it.
    pub suffix: &'a str,
}

/// GBNF for one of `frames`: its prefix, a document of its schema, its suffix (e.g. a tool
/// call in the model's own frame, with the tool's name in the prefix and its parameters'
/// schema). Each schema's `$ref`s resolve inside it. A schema the converter refuses holds its
/// frame's document to any JSON object; those frames come back with the reason.
pub fn framed_to_gbnf(
    frames: &[Framed<'_>],
) -> Result<(String, Vec<(usize, GrammarError)>), GrammarError> {
    let mut c = Converter::new(&Value::Null, "");
    let mut alts = Vec::new();
    let mut refused = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        let document = match frame.schema {
            Some(schema) => {
                c.root = schema;
                c.ref_prefix = format!("f{i}-");
                let mark = c.rules.len();
                c.visit(schema, &format!("frame-{i}")).unwrap_or_else(|e| {
                    // Drop what the refused schema had added.
                    c.rules.truncate(mark);
                    c.index.retain(|_, at| *at < mark);
                    refused.push((i, e));
                    c.primitive("object")
                })
            }
            None => c.primitive("object"),
        };
        alts.push(format!(
            "{} {document} {}",
            literal(frame.prefix),
            literal(frame.suffix)
        ));
    }
    if alts.is_empty() {
        return Err(unsupported("no frames: nothing is allowed"));
    }
    c.add("root", &alts.join(" | "));
    Ok((c.text(), refused))
}

/// Where a chat answer's reasoning stands when its document ([`answer_to_gbnf`]) is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerReasoning {
    /// The model shows no reasoning: the document comes first.
    None,
    /// A `<think>` … `</think>` part may come first.
    May,
    /// The prompt opened `<think>`: the output continues the reasoning up to `</think>`.
    Open,
}

/// GBNF for any text without `delimiter`, then `!` (for tests of [`Converter::excluding`]).
#[cfg(test)]
pub(super) fn excluding_then_bang(delimiter: &str) -> String {
    let mut c = Converter::new(&Value::Null, "");
    let body = c.excluding("body", delimiter);
    c.set("root", &format!(r#"{body} "!""#));
    c.text()
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// GBNF for a chat answer that is one document of `schema` (a `response_format`), as llama.cpp's
/// chat parser generator writes it (`chat-auto-parser-generator.cpp`): the reasoning (see
/// [`AnswerReasoning`]; any text up to `</think>`, then at most two newlines, the whitespace its
/// templates' tags end with), then whitespace and the document, alone or in a
/// ```` ```json ```` fence, and whitespace.
pub fn answer_to_gbnf(schema: &Value, reasoning: AnswerReasoning) -> Result<String, GrammarError> {
    let mut c = Converter::new(schema, "");
    let document = c.visit(schema, "answer")?;
    let space = c.primitive("space");
    let frame = format!(
        "{space} ( {} {space} {document} {space} {} | {space} {document} {space} )",
        literal("```json"),
        literal("```")
    );
    // The rest of a reasoning: its text, `</think>`, the newlines its templates' tags end with.
    let mut thought = || {
        let body = c.excluding("think-body", THINK_CLOSE);
        format!(r#"{body} {} "\n"? "\n"?"#, literal(THINK_CLOSE))
    };
    let root = match reasoning {
        AnswerReasoning::None => frame,
        AnswerReasoning::May => format!("( {} {} )? {frame}", literal(THINK_OPEN), thought()),
        AnswerReasoning::Open => format!("{} {frame}", thought()),
    };
    c.set("root", &root);
    Ok(c.text())
}

const SPACE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// llama.cpp's primitive rules: name, body, the primitives it uses.
const PRIMITIVES: &[(&str, &str, &[&str])] = &[
    ("boolean", r#"("true" | "false")"#, &[]),
    ("decimal-part", "[0-9]{1,16}", &[]),
    ("integral-part", "[0] | [1-9] [0-9]{0,15}", &[]),
    (
        "number",
        r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
        &["integral-part", "decimal-part"],
    ),
    ("integer", r#"("-"? integral-part)"#, &["integral-part"]),
    (
        "value",
        "object | array | string | number | boolean | null",
        &["object", "array", "string", "number", "boolean", "null"],
    ),
    (
        "object",
        r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
        &["string", "value"],
    ),
    (
        "array",
        r#""[" space ( value ("," space value)* )? space "]""#,
        &["value"],
    ),
    (
        "uuid",
        r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
        &[],
    ),
    (
        "char",
        r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
        &[],
    ),
    ("string", r#""\"" char* "\"""#, &["char"]),
    ("null", r#""null""#, &[]),
    (
        "date",
        r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
        &[],
    ),
    (
        "time",
        r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        &[],
    ),
    ("date-time", r#"date "T" time"#, &["date", "time"]),
    ("date-string", r#""\"" date "\"""#, &["date"]),
    ("time-string", r#""\"" time "\"""#, &["time"]),
    ("date-time-string", r#""\"" date-time "\"""#, &["date-time"]),
];

/// Keywords that do not constrain the document.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "strict",
];

/// Keywords by the type they belong to (any of them allowed with no `type`).
const KEYWORDS: &[&str] = &[
    "type",
    "$ref",
    "const",
    "enum",
    "anyOf",
    "oneOf",
    "allOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

struct Converter<'a> {
    /// The schema `$ref`s resolve in.
    root: &'a Value,
    /// Before the names of `$ref` rules (one schema's `#/$defs/x` is not another's).
    ref_prefix: String,
    /// Rules in the order they were added.
    rules: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

fn unsupported(what: impl Into<String>) -> GrammarError {
    GrammarError::Schema(what.into())
}

/// `text` as a GBNF string literal.
fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `value`'s compact JSON text as a GBNF literal.
fn constant(value: &Value) -> String {
    literal(&value.to_string())
}

/// A rule name made of `name`'s letters and digits.
fn rule_name(name: &str) -> String {
    let mut out: String = (name.chars())
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c,
            false => '-',
        })
        .collect();
    if out.is_empty() {
        out.push('x');
    }
    out
}

impl<'a> Converter<'a> {
    fn new(root: &'a Value, ref_prefix: &str) -> Converter<'a> {
        Converter {
            root,
            ref_prefix: ref_prefix.to_string(),
            rules: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// The rules as GBNF text.
    fn text(&self) -> String {
        let mut out = String::new();
        for (name, body) in &self.rules {
            out.push_str(&format!("{name} ::= {body}\n"));
        }
        out
    }

    /// Adds rule `name` (made unique unless the same body has that name) and returns its name.
    fn add(&mut self, name: &str, body: &str) -> String {
        let base = rule_name(name);
        let mut name = base.clone();
        let mut n = 1;
        while let Some(&i) = self.index.get(&name) {
            if self.rules[i].1 == body {
                return name;
            }
            n += 1;
            name = format!("{base}{n}");
        }
        self.index.insert(name.clone(), self.rules.len());
        self.rules.push((name.clone(), body.to_string()));
        name
    }

    /// Defines (or redefines) `name` exactly.
    fn set(&mut self, name: &str, body: &str) {
        match self.index.get(name) {
            Some(&i) => self.rules[i].1 = body.to_string(),
            None => {
                self.index.insert(name.to_string(), self.rules.len());
                self.rules.push((name.to_string(), body.to_string()));
            }
        }
    }

    /// Adds primitive `name` and the ones it uses; returns its name.
    fn primitive(&mut self, name: &str) -> String {
        if !self.index.contains_key("space") {
            self.set("space", SPACE);
        }
        if let Some((_, body, deps)) = PRIMITIVES.iter().find(|p| p.0 == name) {
            if !self.index.contains_key(name) {
                self.set(name, body);
                for dep in deps.iter() {
                    self.primitive(dep);
                }
            }
        }
        name.to_string()
    }

    /// The rule for `schema`, named after `name`.
    fn visit(&mut self, schema: &Value, name: &str) -> Result<String, GrammarError> {
        let obj = match schema {
            Value::Bool(true) => return Ok(self.primitive("value")),
            Value::Bool(false) => return Err(unsupported("the schema `false` allows nothing")),
            Value::Object(obj) => obj,
            _ => return Err(unsupported("a schema must be an object or a boolean")),
        };
        for key in obj.keys() {
            if !KEYWORDS.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
                return Err(unsupported(format!(
                    "JSON schema keyword `{key}` is not supported"
                )));
            }
        }
        self.primitive("space");
        if let Some(r) = obj.get("$ref") {
            return self.reference(r);
        }
        if let Some(value) = obj.get("const") {
            let body = constant(value);
            return Ok(self.add(name, &body));
        }
        if let Some(values) = obj.get("enum") {
            let values = values
                .as_array()
                .ok_or_else(|| unsupported("`enum` must be an array"))?;
            if values.is_empty() {
                return Err(unsupported("`enum` is empty: nothing is allowed"));
            }
            let alts: Vec<String> = values.iter().map(constant).collect();
            return Ok(self.add(name, &format!("({})", alts.join(" | "))));
        }
        if let Some(parts) = obj.get("allOf") {
            return self.all_of(obj, parts, name);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = obj.get(key) {
                return self.union(options, name, key);
            }
        }
        match obj.get("type") {
            None => self.untyped(obj, name),
            Some(Value::String(t)) => {
                check_keywords(obj, &[t])?;
                self.typed(obj, t, name)
            }
            Some(Value::Array(types)) => {
                let types: Vec<&str> = (types.iter().map(Value::as_str).collect::<Option<_>>())
                    .ok_or_else(|| unsupported("`type` entries must be strings"))?;
                if types.is_empty() {
                    return Err(unsupported("`type` is an empty list: nothing is allowed"));
                }
                check_keywords(obj, &types)?;
                let mut alts = Vec::new();
                for (i, t) in types.iter().enumerate() {
                    alts.push(self.typed(obj, t, &format!("{name}-{i}"))?);
                }
                Ok(self.add(name, &alts.join(" | ")))
            }
            Some(_) => Err(unsupported("`type` must be a string or a list of strings")),
        }
    }

    /// `anyOf` / `oneOf`: any of the options (`oneOf`'s exclusiveness is not enforced, as in
    /// llama.cpp).
    fn union(&mut self, options: &Value, name: &str, key: &str) -> Result<String, GrammarError> {
        let options = options
            .as_array()
            .ok_or_else(|| unsupported(format!("`{key}` must be an array")))?;
        if options.is_empty() {
            return Err(unsupported(format!("`{key}` is empty: nothing is allowed")));
        }
        let mut alts = Vec::new();
        for (i, option) in options.iter().enumerate() {
            alts.push(self.visit(option, &format!("{name}-{i}"))?);
        }
        Ok(self.add(name, &alts.join(" | ")))
    }

    /// `allOf` of object schemas, as llama.cpp merges them: every part's properties (a part's
    /// `$ref` followed), required where a part requires them, in order; and, for an `anyOf`
    /// part, its options' properties, optional. No other keys beside it but `type: object`.
    fn all_of(
        &mut self,
        obj: &Map<String, Value>,
        parts: &Value,
        name: &str,
    ) -> Result<String, GrammarError> {
        let parts = (parts.as_array()).ok_or_else(|| unsupported("`allOf` must be an array"))?;
        let beside = |k: &String| {
            k != "allOf"
                && !ANNOTATIONS.contains(&k.as_str())
                && !(k == "type" && obj[k] == "object")
        };
        if let Some(key) = obj.keys().find(|k| beside(k)) {
            return Err(unsupported(format!(
                "`allOf` beside `{key}` is not supported (only object parts are merged)"
            )));
        }
        let mut properties = Map::new();
        let mut required: Vec<Value> = Vec::new();
        for part in parts {
            let part = self.resolved(part)?;
            let options = match part.get("anyOf").and_then(Value::as_array) {
                Some(options) => options.iter().map(|o| (o, false)).collect(),
                None => vec![(part, true)],
            };
            for (option, is_required) in options {
                let option = self.resolved(option)?;
                let props = option.get("properties").and_then(Value::as_object);
                if props.is_none() && option.get("type").is_some_and(|t| t != "object") {
                    return Err(unsupported("`allOf` of schemas other than objects"));
                }
                for (key, schema) in props.into_iter().flatten() {
                    properties.insert(key.clone(), schema.clone());
                }
                let needed = option.get("required").and_then(Value::as_array);
                for key in needed.into_iter().flatten().filter(|_| is_required) {
                    if !required.contains(key) {
                        required.push(key.clone());
                    }
                }
            }
        }
        let mut merged = Map::new();
        merged.insert("properties".into(), Value::Object(properties));
        merged.insert("required".into(), Value::Array(required));
        merged.insert("additionalProperties".into(), Value::Bool(false));
        self.object(&merged, name)
    }

    /// `schema`, or what its `$ref` points at (one step).
    fn resolved<'s>(&self, schema: &'s Value) -> Result<&'s Value, GrammarError>
    where
        'a: 's,
    {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => Ok(self.pointed(r)?.1),
            None => Ok(schema),
        }
    }

    /// The path of the reference `r` (`#/...`) and the part of the schema it points at.
    fn pointed<'r>(&self, r: &'r str) -> Result<(&'r str, &'a Value), GrammarError> {
        let path = r.strip_prefix('#').ok_or_else(|| {
            unsupported(format!(
                "`$ref` {r}: only references inside the schema (`#/...`) are supported"
            ))
        })?;
        let mut target = self.root;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let part = part.replace("~1", "/").replace("~0", "~");
            target = (target.get(&part))
                .ok_or_else(|| unsupported(format!("`$ref` {r} points at nothing")))?;
        }
        Ok((path, target))
    }

    /// `$ref` to `#`, `#/$defs/NAME` or `#/definitions/NAME`.
    fn reference(&mut self, r: &Value) -> Result<String, GrammarError> {
        let r = r
            .as_str()
            .ok_or_else(|| unsupported("`$ref` must be a string"))?;
        let (path, target) = self.pointed(r)?;
        let name = format!("{}ref{}", self.ref_prefix, rule_name(path));
        if !self.index.contains_key(&name) {
            // Reserve the name first: the target may refer to itself.
            self.set(&name, "");
            let body = self.visit(target, &format!("{name}-target"))?;
            self.set(&name, &body);
        }
        Ok(name)
    }

    /// A schema without `type`: by its keywords, else any value.
    fn untyped(&mut self, obj: &Map<String, Value>, name: &str) -> Result<String, GrammarError> {
        let has = |keys: &[&str]| keys.iter().any(|k| obj.contains_key(*k));
        let t = match () {
            _ if has(&["properties", "additionalProperties", "required"]) => "object",
            _ if has(&["items", "prefixItems", "minItems", "maxItems"]) => "array",
            _ if has(&["minLength", "maxLength", "format", "pattern"]) => "string",
            _ if has(&["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]) => "number",
            _ => return Ok(self.primitive("value")),
        };
        check_keywords(obj, &[t])?;
        self.typed(obj, t, name)
    }

    fn typed(
        &mut self,
        obj: &Map<String, Value>,
        t: &str,
        name: &str,
    ) -> Result<String, GrammarError> {
        match t {
            "object" => self.object(obj, name),
            "array" => self.array(obj, name),
            "string" => self.string(obj, name),
            "integer" => self.integer(obj, name),
            "number" => self.number(obj, name),
            "boolean" => Ok(self.primitive("boolean")),
            "null" => Ok(self.primitive("null")),
            _ => Err(unsupported(format!("unknown JSON schema type `{t}`"))),
        }
    }
}

/// Refuses keywords of no type in `types` (they would be ignored).
fn check_keywords(obj: &Map<String, Value>, types: &[&str]) -> Result<(), GrammarError> {
    let own = |t: &str| -> &[&str] {
        match t {
            "object" => &["properties", "required", "additionalProperties"],
            "array" => &["items", "prefixItems", "minItems", "maxItems"],
            "string" => &["minLength", "maxLength", "format", "pattern"],
            "integer" | "number" => &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
            _ => &[],
        }
    };
    let common = ["type", "$ref", "const", "enum", "anyOf", "oneOf"];
    for key in obj.keys().map(String::as_str) {
        let known = types.iter().any(|t| own(t).contains(&key))
            || common.contains(&key)
            || ANNOTATIONS.contains(&key);
        if !known {
            let what = format!(
                "JSON schema keyword `{key}` is not supported with type `{}`",
                types.join("|")
            );
            return Err(unsupported(what));
        }
    }
    Ok(())
}

/// A non-negative count keyword (`minItems`, `maxLength`, ...).
fn count(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, GrammarError> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => (v.as_u64().and_then(|n| usize::try_from(n).ok()))
            .map(Some)
            .ok_or_else(|| unsupported(format!("`{key}` must be a non-negative integer"))),
    }
}

/// `item` between `min` and `max` times (`None`: no limit), `separator` between two, as
/// llama.cpp's `build_repetition`.
fn repetition(item: &str, min: usize, max: Option<usize>, separator: &str) -> String {
    if max == Some(0) {
        return String::new();
    }
    let bounds = |min: usize, max: Option<usize>| match max {
        Some(max) => format!("{{{min},{max}}}"),
        None => format!("{{{min},}}"),
    };
    if separator.is_empty() {
        return match (min, max) {
            (0, Some(1)) => format!("{item}?"),
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            _ => format!("{item}{}", bounds(min, max)),
        };
    }
    let rest = match (min.saturating_sub(1), max.map(|m| m - 1)) {
        (0, Some(0)) => String::new(),
        (lo, hi) => format!(" ({separator} {item}){}", bounds(lo, hi)),
    };
    match min {
        0 => format!("({item}{rest})?"),
        _ => format!("{item}{rest}"),
    }
}

impl Converter<'_> {
    fn object(&mut self, obj: &Map<String, Value>, name: &str) -> Result<String, GrammarError> {
        let empty = Map::new();
        let props = match obj.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(unsupported("`properties` must be an object")),
        };
        let required_names: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => (r.iter().map(Value::as_str).collect::<Option<_>>())
                .ok_or_else(|| unsupported("`required` must be a list of strings"))?,
            Some(_) => return Err(unsupported("`required` must be a list of strings")),
        };
        if let Some(missing) = required_names.iter().find(|r| !props.contains_key(**r)) {
            return Err(unsupported(format!(
                "required property `{missing}` is not in `properties`"
            )));
        }
        let additional = match obj.get("additionalProperties") {
            None if props.is_empty() => return Ok(self.primitive("object")),
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) if props.is_empty() => return Ok(self.primitive("object")),
            Some(schema) => Some(schema),
        };
        // Each property's key-value rule, required ones and optional ones in declaration order.
        let (mut required, mut optional) = (Vec::new(), Vec::new());
        for (prop, schema) in props {
            let value = self.visit(schema, &format!("{name}-{prop}"))?;
            let body = format!(
                "{} space \":\" space {value}",
                literal(&Value::from(prop.as_str()).to_string())
            );
            let rule = self.add(&format!("{name}-{prop}-kv"), &body);
            match required_names.contains(&prop.as_str()) {
                true => required.push(rule),
                false => optional.push(rule),
            }
        }
        let mut repeated = None;
        if let Some(schema) = additional {
            let value = self.visit(schema, &format!("{name}-additional-value"))?;
            let names: Vec<&str> = props.keys().map(String::as_str).collect();
            let key = self.not_strings(&names, &format!("{name}-additional-k"));
            let rule = self.add(
                &format!("{name}-additional-kv"),
                &format!("{key} \":\" space {value}"),
            );
            repeated = Some(rule.clone());
            optional.push(rule);
        }
        let mut body = String::from("\"{\" space ");
        body += &required.join(" \",\" space ");
        if !optional.is_empty() {
            let combos = self.optional_runs(&optional, repeated.as_deref(), name);
            body += &match required.is_empty() {
                true => format!(" ({combos})?"),
                false => format!(" ( \",\" space ( {combos} ) )?"),
            };
        }
        body += " space \"}\"";
        Ok(self.add(name, &body))
    }

    /// The optional properties that may follow, in order, each present or not, as
    /// alternatives by the first one present (`repeated`: the additional-property rule, which
    /// may come any number of times, last).
    fn optional_runs(&mut self, optional: &[String], repeated: Option<&str>, name: &str) -> String {
        let mut alts = Vec::new();
        for i in 0..optional.len() {
            let first = &optional[i];
            let mut alt = first.clone();
            if repeated == Some(first.as_str()) {
                alt += &format!(" ( \",\" space {first} )*");
            }
            if i + 1 < optional.len() {
                let rest: Vec<String> = (optional[i + 1..].iter())
                    .map(|k| match repeated == Some(k.as_str()) {
                        true => format!("( \",\" space {k} )*"),
                        false => format!("( \",\" space {k} )?"),
                    })
                    .collect();
                alt += " ";
                alt += &self.add(&format!("{name}-{first}-rest"), &rest.join(" "));
            }
            alts.push(alt);
        }
        alts.join(" | ")
    }

    /// Any text without `delimiter` in it (llama.cpp's `until` in GBNF): a rule per state of
    /// the text's longest suffix that begins `delimiter`, every state final, no transition
    /// completing it. Returns the start state's rule.
    fn excluding(&mut self, name: &str, delimiter: &str) -> String {
        let d: Vec<char> = delimiter.chars().collect();
        // The state after reading `c` with the first `k` characters of `d` matched.
        let next = |k: usize, c: char| {
            (0..=k)
                .rev()
                .find(|&j| {
                    let text = d[k - j..k].iter().chain(std::iter::once(&c));
                    j < d.len() && text.eq(d[..=j].iter())
                })
                .map_or(0, |j| j + 1)
        };
        let state = |k: usize| format!("{name}-{k}");
        let mut chars: Vec<char> = d.clone();
        chars.sort_unstable();
        chars.dedup();
        for k in 0..d.len() {
            let mut body = String::new();
            let mut special = String::new();
            for &c in &chars {
                special.push_str(&class_char(c));
                let to = next(k, c);
                if to == d.len() {
                    continue;
                }
                body.push_str(&format!(" | [{}] {}", class_char(c), state(to)));
            }
            body.push_str(&format!(" | [^{special}] {}", state(0)));
            self.set(&state(k), &body);
        }
        state(0)
    }

    /// A JSON string that is none of `names` (llama.cpp's `_not_strings`: a trie of the
    /// names, leaving it at the first character no name has there).
    fn not_strings(&mut self, names: &[&str], rule: &str) -> String {
        let char_rule = self.primitive("char");
        #[derive(Default)]
        struct Trie {
            children: std::collections::BTreeMap<char, Trie>,
            end: bool,
        }
        let mut trie = Trie::default();
        for name in names {
            let mut at = &mut trie;
            for c in name.chars() {
                at = at.children.entry(c).or_default();
            }
            at.end = true;
        }
        fn walk(node: &Trie, char_rule: &str, out: &mut String) {
            let mut rejects = String::new();
            for (i, (c, child)) in node.children.iter().enumerate() {
                let c = class_char(*c);
                rejects += &c;
                if i > 0 {
                    out.push_str(" | ");
                }
                out.push_str(&format!("[{c}]"));
                match child.children.is_empty() {
                    false => {
                        out.push_str(" (");
                        walk(child, char_rule, out);
                        // The text may end here unless that makes a name.
                        out.push_str(if child.end { ")" } else { ")?" });
                    }
                    true => out.push_str(&format!(" {char_rule}+")),
                }
            }
            if !node.children.is_empty() {
                // Any other plain character (escapes begin with `\`, which `char` takes).
                let plain = format!("[^\"\\\\\\x7F\\x00-\\x1F{rejects}]");
                out.push_str(&format!(" | {plain} {char_rule}*"));
            }
        }
        let mut body = String::from("[\"] ( ");
        walk(&trie, &char_rule, &mut body);
        body.push_str(" )");
        if !trie.end {
            body.push('?');
        }
        body.push_str(" [\"]");
        self.add(rule, &body)
    }

    fn array(&mut self, obj: &Map<String, Value>, name: &str) -> Result<String, GrammarError> {
        if let Some(prefix) = obj.get("prefixItems") {
            return self.tuple(obj, prefix, name);
        }
        let (min, max) = (
            count(obj, "minItems")?.unwrap_or(0),
            count(obj, "maxItems")?,
        );
        let item = match obj.get("items") {
            None | Some(Value::Bool(true)) if min == 0 && max.is_none() => {
                return Ok(self.primitive("array"));
            }
            None => self.primitive("value"),
            Some(items) => self.visit(items, &format!("{name}-item"))?,
        };
        if max.is_some_and(|max| max < min) {
            return Err(unsupported(
                "`maxItems` is below `minItems`: nothing is allowed",
            ));
        }
        let items = repetition(&item, min, max, "\",\" space");
        Ok(self.add(name, &format!("\"[\" space {items} space \"]\"")))
    }

    /// `prefixItems`: exactly these items (`items` other than `false` is refused).
    fn tuple(
        &mut self,
        obj: &Map<String, Value>,
        prefix: &Value,
        name: &str,
    ) -> Result<String, GrammarError> {
        let prefix = prefix
            .as_array()
            .ok_or_else(|| unsupported("`prefixItems` must be an array"))?;
        for key in ["items", "minItems", "maxItems"] {
            if obj.get(key).is_some_and(|v| v != &Value::Bool(false)) {
                return Err(unsupported(format!(
                    "`{key}` with `prefixItems` is not supported"
                )));
            }
        }
        let mut parts = Vec::new();
        for (i, item) in prefix.iter().enumerate() {
            parts.push(self.visit(item, &format!("{name}-tuple-{i}"))?);
        }
        let body = format!("\"[\" space {} space \"]\"", parts.join(" \",\" space "));
        Ok(self.add(name, &body))
    }

    fn string(&mut self, obj: &Map<String, Value>, name: &str) -> Result<String, GrammarError> {
        let (min, max) = (count(obj, "minLength")?, count(obj, "maxLength")?);
        if let Some(pattern) = obj.get("pattern") {
            let pattern =
                (pattern.as_str()).ok_or_else(|| unsupported("`pattern` must be a string"))?;
            if min.is_some() || max.is_some() || obj.contains_key("format") {
                return Err(unsupported(
                    "`pattern` with `minLength`, `maxLength` or `format` is not supported",
                ));
            }
            let body = super::pattern::to_gbnf(pattern)?;
            return Ok(self.add(name, &format!("\"\\\"\" {body} \"\\\"\"")));
        }
        if let Some(format) = obj.get("format") {
            if min.is_some() || max.is_some() {
                return Err(unsupported(
                    "`format` with `minLength`/`maxLength` is not supported",
                ));
            }
            let prim = match format.as_str() {
                Some("uuid") => "uuid",
                Some("date") => "date-string",
                Some("time") => "time-string",
                Some("date-time") => "date-time-string",
                _ => {
                    let what = format!("string `format` {format} is not supported (date, time, date-time, uuid are)");
                    return Err(unsupported(what));
                }
            };
            return Ok(self.primitive(prim));
        }
        if min.is_none() && max.is_none() {
            return Ok(self.primitive("string"));
        }
        let (min, max) = (min.unwrap_or(0), max);
        if max.is_some_and(|max| max < min) {
            return Err(unsupported(
                "`maxLength` is below `minLength`: nothing is allowed",
            ));
        }
        let chars = repetition(&self.primitive("char"), min, max, "");
        Ok(self.add(name, &format!("\"\\\"\" {chars} \"\\\"\"")))
    }

    /// An integer, between its bounds if it has any.
    fn integer(&mut self, obj: &Map<String, Value>, name: &str) -> Result<String, GrammarError> {
        let bound = |key: &str, exclusive: bool, up: bool| -> Result<Option<i64>, GrammarError> {
            let Some(v) = bound_keyword(obj, key)? else {
                return Ok(None);
            };
            let v = match (up, exclusive) {
                (false, false) => v.ceil(),
                (false, true) => v.floor() + 1.0,
                (true, false) => v.floor(),
                (true, true) => v.ceil() - 1.0,
            };
            match v.abs() < 1e15 {
                true => Ok(Some(v as i64)),
                false => Err(unsupported(format!(
                    "`{key}` beyond 15 digits is not supported"
                ))),
            }
        };
        let lo = [
            bound("minimum", false, false)?,
            bound("exclusiveMinimum", true, false)?,
        ];
        let hi = [
            bound("maximum", false, true)?,
            bound("exclusiveMaximum", true, true)?,
        ];
        let lo = lo.into_iter().flatten().max();
        let hi = hi.into_iter().flatten().min();
        if lo.is_none() && hi.is_none() {
            return Ok(self.primitive("integer"));
        }
        if let (Some(lo), Some(hi)) = (lo, hi) {
            if hi < lo {
                return Err(unsupported("the integer bounds leave no value"));
            }
        }
        Ok(self.add(name, &int_range(lo, hi)))
    }

    /// A number, between its bounds if it has any (then written without an exponent).
    fn number(&mut self, obj: &Map<String, Value>, name: &str) -> Result<String, GrammarError> {
        let bound = |key: &str, strict: bool| -> Result<Option<(f64, bool)>, GrammarError> {
            Ok(bound_keyword(obj, key)?.map(|v| (v, strict)))
        };
        // The tighter of each pair; at equal values the exclusive one.
        let tighter = |a: Option<(f64, bool)>, b: Option<(f64, bool)>, lower: bool| match (a, b) {
            (Some(x), Some(y)) if x.0 == y.0 => Some((x.0, x.1 || y.1)),
            (Some(x), Some(y)) => Some(if (x.0 > y.0) == lower { x } else { y }),
            (x, y) => x.or(y),
        };
        let lo = tighter(
            bound("minimum", false)?,
            bound("exclusiveMinimum", true)?,
            true,
        );
        let hi = tighter(
            bound("maximum", false)?,
            bound("exclusiveMaximum", true)?,
            false,
        );
        if lo.is_none() && hi.is_none() {
            return Ok(self.primitive("number"));
        }
        if let (Some(l), Some(h)) = (lo, hi) {
            if l.0 > h.0 || (l.0 == h.0 && (l.1 || h.1)) {
                return Err(unsupported("the number bounds leave no value"));
            }
        }
        let digits = |b: Option<(f64, bool)>| -> Result<_, GrammarError> {
            b.map(|(v, strict)| {
                split_decimal(v, strict).ok_or_else(|| {
                    unsupported(format!(
                        "a number bound of more than 15 integral digits or {MAX_FRACTION} decimals ({v}) is not supported"
                    ))
                })
            })
            .transpose()
        };
        let body = decimal_range(digits(lo)?, digits(hi)?);
        Ok(self.add(name, &body))
    }
}

/// A bound keyword's value (`minimum`, `exclusiveMaximum`, ...): a finite number, or absent.
fn bound_keyword(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, GrammarError> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => (v.as_f64().filter(|v| v.is_finite()))
            .map(Some)
            .ok_or_else(|| unsupported(format!("`{key}` must be a number"))),
    }
}

/// `c` inside a GBNF character class.
fn class_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '"' | '^' | '-' => format!("\\x{:02X}", c as u32),
        c if (c as u32) < 0x20 => format!("\\x{:02X}", c as u32),
        c => c.to_string(),
    }
}
