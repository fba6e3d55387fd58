//! What llama.cpp's Jinja engine accepts in chat templates beyond what minijinja does: Hugging
//! Face's `{% generation %}` mask tags (rewritten to a block that renders its body, as
//! llama.cpp ignores them) and lists inside a `namespace()` that the template changes in place
//! (`ns.ids.append(x)`, `ns.ids.pop(0)`: Python's lists are mutable, minijinja's are not).

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, State, Value};
use std::sync::{Arc, Mutex};

/// `source` with every `{% generation %}` and `{% endgeneration %}` (whatever their whitespace
/// control) turned into `{% if true %}` and `{% endif %}`: the body renders as it is, and the
/// tags trim the same whitespace.
pub(super) fn rewrite_generation_tags(source: &str) -> String {
    static TAG: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(\{%[-+]?\s*)(end)?generation(\s*[-+]?%\})").ok()
    });
    let Some(tag) = TAG.as_ref() else {
        return source.to_string();
    };
    tag.replace_all(source, |c: &regex::Captures| {
        let keyword = if c.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{}{keyword}{}", &c[1], &c[3])
    })
    .into_owned()
}

/// Jinja's `indent` filter as Python's Jinja (and llama.cpp's engine) computes it: every line
/// but the first (and with `first`, the first too) prefixed by `width` spaces (or by `width`
/// itself when it is a string), blank lines only with `blank`, and a trailing newline kept
/// (minijinja's own filter drops it: Command R+'s tool calls lost a line break).
pub(super) fn indent(
    value: String,
    width: Option<Value>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let width = match kwargs.get::<Option<Value>>("width")? {
        Some(w) => Some(w),
        None => width,
    };
    let first = kwargs
        .get::<Option<bool>>("first")?
        .or(first)
        .unwrap_or(false);
    let blank = kwargs
        .get::<Option<bool>>("blank")?
        .or(blank)
        .unwrap_or(false);
    kwargs.assert_all_used()?;
    let prefix = match width {
        None => " ".repeat(4),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_string(),
        Some(w) => {
            let n = usize::try_from(w).map_err(|_| {
                Error::new(ErrorKind::InvalidOperation, "indent: width is not a count")
            })?;
            " ".repeat(n)
        }
    };
    // Python's `(s + "\n").splitlines()`: the lines, a final empty one where `s` ends in a
    // newline.
    let text = value + "\n";
    let lines: Vec<&str> = text
        .split_terminator('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut out = String::with_capacity(text.len() + prefix.len() * lines.len());
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            if blank || !line.is_empty() {
                out.push_str(&prefix);
            }
        }
        out.push_str(line);
    }
    if first {
        out.insert_str(0, &prefix);
    }
    Ok(out)
}

/// Jinja's `namespace()`, with every list among its initial values made a [`MutableList`].
pub(super) fn namespace(defaults: Option<ValueOrKwargs>) -> Result<Value, Error> {
    let Some(defaults) = defaults else {
        return minijinja::functions::namespace(None);
    };
    let defaults = defaults.into_value();
    let Some(pairs) = defaults
        .as_object()
        .filter(|o| matches!(o.repr(), ObjectRepr::Map))
        .and_then(|o| o.try_iter_pairs())
    else {
        return minijinja::functions::namespace(Some(to_arg(&defaults)?));
    };
    let pairs: std::collections::BTreeMap<Value, Value> = pairs
        .map(|(key, value)| {
            if value.kind() == ValueKind::Seq
                && value.downcast_object_ref::<MutableList>().is_none()
            {
                let items = value.try_iter().map(|i| i.collect()).unwrap_or_default();
                (key, MutableList::value(items))
            } else {
                (key, value)
            }
        })
        .collect();
    minijinja::functions::namespace(Some(to_arg(&Value::from_object(pairs))?))
}

fn to_arg(value: &Value) -> Result<ValueOrKwargs, Error> {
    <ValueOrKwargs as minijinja::value::ArgType>::from_value(Some(value))
}

/// A list a template may change in place: `append`, `extend`, `insert`, `pop`, `clear`;
/// everything else (indexing, iteration, `length`, truthiness, Python's other list methods)
/// as for any list.
#[derive(Debug, Default)]
pub(super) struct MutableList(Mutex<Vec<Value>>);

impl MutableList {
    fn value(items: Vec<Value>) -> Value {
        Value::from_object(MutableList(Mutex::new(items)))
    }

    fn items(&self) -> Result<std::sync::MutexGuard<'_, Vec<Value>>, Error> {
        self.0
            .lock()
            .map_err(|_| Error::new(ErrorKind::InvalidOperation, "a list was left half-changed"))
    }

    /// Python's `list.pop(index = -1)`.
    fn pop(&self, args: &[Value]) -> Result<Value, Error> {
        let mut items = self.items()?;
        let len = items.len() as i64;
        let at = match args {
            [] => -1,
            [i] => i64::try_from(i.clone())?,
            _ => {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    "pop takes at most one index",
                ))
            }
        };
        let at = if at < 0 { at + len } else { at };
        if !(0..len).contains(&at) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "pop index out of range",
            ));
        }
        Ok(items.remove(at as usize))
    }
}

impl Object for MutableList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.items().ok()?;
        let at = i64::try_from(key.clone()).ok()?;
        let at = if at < 0 { at + items.len() as i64 } else { at };
        usize::try_from(at)
            .ok()
            .and_then(|at| items.get(at).cloned())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.items() {
            Ok(items) => Enumerator::Values(items.clone()),
            Err(_) => Enumerator::Empty,
        }
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        let none = Value::from(());
        match (method, args) {
            ("append", [item]) => self.items()?.push(item.clone()),
            ("extend", [more]) => self.items()?.extend(more.try_iter()?),
            ("insert", [at, item]) => {
                let mut items = self.items()?;
                let len = items.len() as i64;
                let at = i64::try_from(at.clone())?;
                let at = if at < 0 {
                    (at + len).max(0)
                } else {
                    at.min(len)
                };
                items.insert(at as usize, item.clone());
            }
            ("clear", []) => self.items()?.clear(),
            ("pop", args) => return self.pop(args),
            _ => return Err(Error::from(ErrorKind::UnknownMethod)),
        }
        Ok(none)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{value_from_json, ChatTemplate, ChatTemplateInputs};

    fn render(source: &str) -> String {
        let template = ChatTemplate::new(source, "<s>", "</s>").expect("compiles");
        let mut inputs = ChatTemplateInputs::from_messages(&[]);
        inputs.messages = value_from_json(r#"[{"role": "user", "content": "hi"}]"#).expect("json");
        inputs.now = Some(0);
        template.render(&inputs).expect("renders")
    }

    #[test]
    fn generation_tags_render_their_body_and_trim_as_other_tags() {
        let tagged = "{% for m in messages %}[{%- generation -%}\n  {{ m.content }}  \n{%- endgeneration -%}]{% endfor %}";
        let plain = "{% for m in messages %}[{%- if true -%}\n  {{ m.content }}  \n{%- endif -%}]{% endfor %}";
        assert_eq!(render(tagged), "[hi]");
        assert_eq!(render(tagged), render(plain));
        let loose = "A {% generation %}B{% endgeneration %} C";
        assert_eq!(render(loose), "A B C");
        // Only the tag names change: text and other tags that mention the word stay.
        let named = "{% set generation = 'g' %}{{ generation }} generation {%+ generation +%}x{% endgeneration %}";
        assert_eq!(render(named), "g generation x");
    }

    /// Python's `indent`: a trailing newline kept, blank lines left alone unless `blank`, the
    /// first line with `first`, a string as the prefix; positional or keyword arguments.
    #[test]
    fn indent_is_pythons() {
        let cases = [
            ("{{ 'a\\nb\\n'|indent(2) }}", "a\n  b\n"),
            ("{{ '{\\n'|indent(4, first=true) }}", "    {\n"),
            ("{{ 'a\\n\\nb'|indent(2, true) }}", "  a\n\n  b"),
            ("{{ 'a\\n\\nb'|indent(width=2, blank=true) }}", "a\n  \n  b"),
            ("{{ 'a\\nb'|indent('> ') }}", "a\n> b"),
            ("{{ 'a\\nb'|indent }}", "a\n    b"),
        ];
        for (source, want) in cases {
            let mut env = minijinja::Environment::new();
            env.add_filter("indent", super::indent);
            env.add_template("t", source).unwrap();
            let got = env.get_template("t").unwrap().render(()).unwrap();
            assert_eq!(got, want, "{source}");
        }
    }

    #[test]
    fn namespace_lists_change_in_place() {
        let source = "{%- set ns = namespace(ids=[], n=0, other=[7]) -%}\
            {%- set _ = ns.ids.append('a') -%}{%- set _ = ns.ids.append('b') -%}\
            {%- set _ = ns.ids.extend(['c', 'd']) -%}{%- set _ = ns.ids.insert(0, 'z') -%}\
            {{ ns.ids | length }} {{ ns.ids[0] }}{{ ns.ids[-1] }} {{ ns.ids.pop(0) }}{{ ns.ids.pop() }} \
            {{ ns.ids | join(',') }} {{ ns.ids | tojson }} {{ 'c' in ns.ids }} \
            {%- for i in ns.ids %} {{ loop.index }}{{ i }}{% endfor %} \
            {{ ns.other[0] }}{% set _ = ns.other.clear() %}{{ 'full' if ns.other else 'empty' }}";
        assert_eq!(
            render(source),
            "5 zd zd a,b,c [\"a\", \"b\", \"c\"] True 1a 2b 3c 7empty"
        );
    }

    #[test]
    fn bad_list_calls_are_errors_not_panics() {
        for source in [
            "{% set ns = namespace(ids=[]) %}{{ ns.ids.pop() }}",
            "{% set ns = namespace(ids=[1]) %}{{ ns.ids.pop(3) }}",
            "{% set ns = namespace(ids=[1]) %}{{ ns.ids.pop(0, 1) }}",
            "{% set ns = namespace(ids=[1]) %}{{ ns.ids.frobnicate() }}",
        ] {
            let template = ChatTemplate::new(source, "", "").expect("compiles");
            let inputs = ChatTemplateInputs::from_messages(&[]);
            assert!(template.render(&inputs).is_err(), "{source}");
        }
    }
}
