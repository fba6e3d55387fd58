//! GBNF for the JSON numbers between bounds: integers (as llama.cpp's `_build_min_max_int`,
//! one digit count at a time) and decimals, which llama.cpp does not bound. A bounded decimal
//! is written without an exponent: `-`, an integral part without leading zeros, and an
//! optional fraction, whose digits are held to the bounds digit by digit where the integral
//! part equals a bound's.

/// A bound of a decimal range: a non-negative value written as its integral part and its
/// fraction digits (no trailing zeros), and whether the value itself is excluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Bound {
    pub int: u64,
    pub frac: String,
    pub strict: bool,
}

/// A finite number as a sign and a [`Bound`]'s digits: `None` where its integral part has more
/// than 15 digits or its fraction more than [`MAX_FRACTION`] (f64's shortest decimal form).
pub(super) fn split_decimal(v: f64, strict: bool) -> Option<(bool, Bound)> {
    if !v.is_finite() || v.abs() >= 1e15 {
        return None;
    }
    let text = format!("{}", v.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > MAX_FRACTION {
        return None;
    }
    let int = int.parse().ok()?;
    let bound = Bound {
        int,
        frac: frac.to_string(),
        strict,
    };
    Some((v < 0.0, bound))
}

/// The most fraction digits a bound may have.
pub(super) const MAX_FRACTION: usize = 32;

/// Free digits after the bounded ones: as many as llama.cpp's `decimal-part` allows.
const FREE_DIGITS: &str = "[0-9]{0,16}";

/// GBNF for the decimals `x` with `lo <= x` (`<` if strict) and `x <= hi` (likewise), each
/// bound signed (`(negative, magnitude)`); `None`: unbounded. Empty if no decimal is inside.
pub(super) fn decimal_range(lo: Option<(bool, Bound)>, hi: Option<(bool, Bound)>) -> String {
    let zero = |strict| Bound {
        int: 0,
        frac: String::new(),
        strict,
    };
    let mut alts = Vec::new();
    // Negative values: "-" and their magnitude, above -hi (and above 0) and below -lo.
    if lo.as_ref().is_none_or(|(neg, b)| *neg && !is_zero(b)) {
        let above = match &hi {
            Some((true, b)) if !is_zero(b) => b.clone(),
            _ => zero(true),
        };
        let below = lo.as_ref().map(|(_, b)| b.clone());
        let body = non_negative(Some(above), below);
        if !body.is_empty() {
            alts.push(format!("\"-\" ({body})"));
        }
    }
    // Values from 0 on: above lo where lo is positive, below hi.
    let hi_reaches_zero = match &hi {
        None => true,
        Some((neg, b)) => !*neg || is_zero(b),
    };
    if hi_reaches_zero {
        let above = lo.and_then(|(neg, b)| (!neg || is_zero(&b)).then_some(b));
        let below = hi.map(|(_, b)| match is_zero(&b) {
            true => zero(b.strict),
            false => b,
        });
        let body = non_negative(above, below);
        if !body.is_empty() {
            alts.push(format!("({body})"));
        }
    }
    alts.join(" | ")
}

fn is_zero(b: &Bound) -> bool {
    b.int == 0 && b.frac.is_empty()
}

/// GBNF for the non-negative decimals between the bounds (no sign): per integral part, the
/// fractions that part allows.
fn non_negative(lo: Option<Bound>, hi: Option<Bound>) -> String {
    let mut alts = Vec::new();
    fn digits(b: &Option<Bound>) -> Option<(&str, bool)> {
        b.as_ref().map(|b| (b.frac.as_str(), b.strict))
    }
    match (&lo, &hi) {
        (Some(l), Some(h)) if l.int == h.int => {
            push_with_fraction(
                &mut alts,
                format!("\"{}\"", l.int),
                digits(&lo),
                digits(&hi),
            );
            return alts.join(" | ");
        }
        (Some(l), Some(h)) if l.int > h.int => return String::new(),
        _ => {}
    }
    if let Some(l) = &lo {
        push_with_fraction(&mut alts, format!("\"{}\"", l.int), digits(&lo), None);
    }
    let from = lo.as_ref().map_or(0, |l| l.int + 1);
    let to = match &hi {
        Some(h) if h.int == 0 => None,
        Some(h) => Some(Some(h.int - 1)),
        None => Some(None),
    };
    if let Some(to) = to.filter(|to| to.is_none_or(|to| to >= from)) {
        alts.push(format!("({}) (\".\" [0-9]{{1,16}})?", uint_range(from, to)));
    }
    if let Some(h) = &hi {
        let whole = format!("\"{}\"", h.int);
        push_with_fraction(&mut alts, whole, None, digits(&hi));
    }
    alts.join(" | ")
}

/// `whole` followed by the fractions whose digits are above `lo` and below `hi` (`(digits,
/// strict)`, `None`: unbounded), if any is.
fn push_with_fraction(
    alts: &mut Vec<String>,
    whole: String,
    lo: Option<(&str, bool)>,
    hi: Option<(&str, bool)>,
) {
    let (digits, empty_ok) = fraction(lo, hi);
    match (digits.is_empty(), empty_ok) {
        (true, true) => alts.push(whole),
        (true, false) => {}
        (false, true) => alts.push(format!("{whole} (\".\" ({digits}))?")),
        (false, false) => alts.push(format!("{whole} \".\" ({digits})")),
    }
}

/// The non-empty digit strings `s` with `0.lo <= 0.s <= 0.hi` (`<` where strict; `None`:
/// unbounded) as GBNF (empty: none), and whether the empty string (a value with no fraction)
/// is inside too. Decided one digit at a time: a digit above `lo`'s first and below `hi`'s
/// leaves the rest free; one equal to a bound's first digit leaves the rest bounded by that
/// bound's rest.
fn fraction(lo: Option<(&str, bool)>, hi: Option<(&str, bool)>) -> (String, bool) {
    // `>= 0` holds for every fraction.
    let lo = lo.filter(|&(d, strict)| !d.is_empty() || strict);
    let empty_ok = lo.is_none() && hi.is_none_or(|(d, strict)| !d.is_empty() || !strict);
    match (lo, hi) {
        (None, None) => return ("[0-9]{1,16}".to_string(), true),
        // Below 0, or above 0 and at most 0: nothing.
        (_, Some(("", true))) | (Some(_), Some(("", false))) => return (String::new(), false),
        (None, Some(("", false))) => return ("\"0\"{1,16}".to_string(), true),
        (Some(("", _)), None) => return (format!("\"0\"{{0,15}} [1-9] {FREE_DIGITS}"), false),
        _ => {}
    }
    let first = |(d, _): (&str, bool)| d.as_bytes().first().copied().unwrap_or(b'0');
    fn rest((d, strict): (&str, bool)) -> (&str, bool) {
        (d.get(1..).unwrap_or(""), strict)
    }
    let mut alts = Vec::new();
    let mut free: Option<(u8, u8)> = None;
    for c in b'0'..=b'9' {
        // Per bound: `Some(None)` leaves the rest free, `Some(Some(rest))` bounds it, `None`:
        // this digit is outside.
        let lo_after = match lo {
            None => Some(None),
            Some(b) if c > first(b) => Some(None),
            Some(b) if c == first(b) => Some(Some(rest(b))),
            Some(_) => None,
        };
        let hi_after = match hi {
            None => Some(None),
            Some(b) if c < first(b) => Some(None),
            Some(b) if c == first(b) => Some(Some(rest(b))),
            Some(_) => None,
        };
        match (lo_after, hi_after) {
            (Some(None), Some(None)) => free = Some(free.map_or((c, c), |(a, _)| (a, c))),
            (Some(l), Some(h)) => push_digit(&mut alts, c, l, h),
            _ => {}
        }
    }
    if let Some((a, b)) = free {
        alts.push(format!("[{}-{}] {FREE_DIGITS}", a as char, b as char));
    }
    (alts.join(" | "), empty_ok)
}

/// Digit `c` followed by the digit strings (maybe none) that [`fraction`] allows after it.
fn push_digit(alts: &mut Vec<String>, c: u8, lo: Option<(&str, bool)>, hi: Option<(&str, bool)>) {
    let (tail, empty_ok) = fraction(lo, hi);
    let c = c as char;
    match (tail.is_empty(), empty_ok) {
        (true, true) => alts.push(format!("\"{c}\"")),
        (true, false) => {}
        (false, true) => alts.push(format!("\"{c}\" ({tail})?")),
        (false, false) => alts.push(format!("\"{c}\" ({tail})")),
    }
}

/// The most digits an unbounded integer takes (llama.cpp's `integral-part`).
const MAX_DIGITS: usize = 16;

/// GBNF for the decimal integers in `lo..=hi` (`None`: unbounded), without leading zeros.
pub(super) fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    let mut alts = Vec::new();
    // Negative part: "-" and the absolute values.
    if lo.is_none_or(|lo| lo < 0) {
        let abs_lo = hi.map_or(1, |hi| (-hi).max(1) as u64);
        let abs_hi = lo.map(|lo| lo.unsigned_abs());
        if abs_hi.is_none_or(|h| h >= abs_lo) {
            alts.push(format!("\"-\" ({})", uint_range(abs_lo, abs_hi)));
        }
    }
    if hi.is_none_or(|hi| hi >= 0) {
        let from = lo.map_or(0, |lo| lo.max(0) as u64);
        alts.push(format!("({})", uint_range(from, hi.map(|hi| hi as u64))));
    }
    alts.join(" | ")
}

/// GBNF for the integers in `lo..=hi` (`None`: up to [`MAX_DIGITS`] digits), no leading
/// zeros: a range of one digit count at a time.
fn uint_range(lo: u64, hi: Option<u64>) -> String {
    let digits = |n: u64| n.to_string().len();
    let mut alts = Vec::new();
    let last = hi.map_or(MAX_DIGITS, digits);
    for len in digits(lo)..=last {
        let floor = if len == 1 {
            0
        } else {
            10u64.pow(len as u32 - 1)
        };
        let ceil = 10u64.saturating_pow(len as u32).saturating_sub(1);
        let (a, b) = (lo.max(floor), hi.map_or(ceil, |hi| hi.min(ceil)));
        if a <= b {
            alts.push(same_length(&a.to_string(), &b.to_string()));
        }
    }
    alts.join(" | ")
}

/// GBNF for the numbers from `lo` to `hi`, both written with the same number of digits.
fn same_length(lo: &str, hi: &str) -> String {
    let (Some(a), Some(b)) = (lo.chars().next(), hi.chars().next()) else {
        return "\"\"".to_string();
    };
    let (rest_lo, rest_hi) = (&lo[1..], &hi[1..]);
    let n = rest_lo.len();
    let any = |n: usize| match n {
        0 => String::new(),
        n => format!(" [0-9]{{{n}}}"),
    };
    if a == b {
        return match n {
            0 => format!("\"{a}\""),
            _ => format!("\"{a}\" ({})", same_length(rest_lo, rest_hi)),
        };
    }
    let mut alts = Vec::new();
    let tail = |lo: &str, hi: &str| match n {
        0 => String::new(),
        _ => format!(" ({})", same_length(lo, hi)),
    };
    let nines = "9".repeat(n);
    let zeros = "0".repeat(n);
    alts.push(format!("\"{a}\"{}", tail(rest_lo, &nines)));
    let (a1, b1) = (a as u8 + 1, b as u8 - 1);
    if a1 <= b1 {
        alts.push(format!("[{}-{}]{}", a1 as char, b1 as char, any(n)));
    }
    alts.push(format!("\"{b}\"{}", tail(&zeros, rest_hi)));
    alts.join(" | ")
}
