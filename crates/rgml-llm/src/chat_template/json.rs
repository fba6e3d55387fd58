//! `tojson` output as llama.cpp's Jinja engine writes it (Python's `json.dumps` layout with
//! configurable separators, keys in insertion order, no HTML escaping).

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// The layout: an indent (one item per line) or none, and the two separators.
pub(super) struct Style {
    pub indent: Option<usize>,
    pub item_sep: String,
    pub key_sep: String,
}

/// Serializes `value`.
pub(super) fn to_json(value: &Value, style: &Style) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, style: &Style, level: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), items.len(), style, level, |out, i| {
                write_value(out, &items[i], style, level + 1)
            })?;
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('{', '}'), keys.len(), style, level, |out, i| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => write_string(out, s),
                    None => write_string(out, &key.to_string()),
                }
                out.push_str(&style.key_sep);
                write_value(out, &value.get_item(key)?, style, level + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("cannot serialize a {} to JSON", value.kind()),
            ))
        }
    }
    Ok(())
}

/// `[`/`{`, the items (each on its own line when indenting), `]`/`}`.
fn write_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    style: &Style,
    level: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len > 0 {
        for i in 0..len {
            if let Some(indent) = style.indent {
                out.push('\n');
                out.push_str(&" ".repeat(indent * (level + 1)));
            }
            item(out, i)?;
            if i + 1 < len {
                out.push_str(&style.item_sep);
            }
        }
        if let Some(indent) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(indent * level));
        }
    }
    out.push(close);
    Ok(())
}

/// Integers as they are; floats as C++'s `ostream <<` (6 significant digits, `%g`).
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    out.push_str(&format_g(f));
}

/// C's `%g` with precision 6.
fn format_g(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "nan"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        }
        .to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let exp = format!("{f:.5e}");
    let (mantissa, e) = exp.split_once('e').unwrap_or((&exp, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    if (-4..6).contains(&e) {
        let decimals = (5 - e).max(0) as usize;
        trim_zeros(&format!("{f:.decimals$}"))
    } else {
        let sign = if e < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_zeros(mantissa), e.abs())
    }
}

fn trim_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `ensure_ascii=True`: characters beyond ASCII as `\uXXXX` (surrogate pairs above U+FFFF).
pub(super) fn ascii_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::format_g;

    #[test]
    fn floats_print_like_cpp_streams() {
        assert_eq!(format_g(2.5), "2.5");
        assert_eq!(format_g(1.0), "1");
        assert_eq!(format_g(0.1), "0.1");
        assert_eq!(format_g(1234567.0), "1.23457e+06");
        assert_eq!(format_g(0.0001), "0.0001");
        assert_eq!(format_g(0.00001), "1e-05");
    }
}
