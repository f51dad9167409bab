//! Value shapes: a Compose value read as text, a number, a duration, a size, a list, a
//! mapping... Each returns the message of what was expected; the caller names the key.

use std::collections::BTreeMap;

use crate::units::{
    check_mode, cpus_to_nano, parse_duration_ms, parse_octal_mode, parse_size_bytes,
};
use crate::yaml::Node;

use super::ServiceCtx;

/// Any scalar as text (numbers and booleans as written).
pub(crate) fn text(n: &Node) -> Result<String, String> {
    n.scalar_text()
        .ok_or_else(|| format!("expected text, found {}", n.kind()))
}

/// `true`/`false`, also as text in any case.
pub(crate) fn boolean(n: &Node) -> Result<bool, String> {
    // YAML 1.1's words too (`privileged: yes`), which Compose reads as booleans.
    const TRUE: &[&str] = &["true", "yes", "y", "on"];
    const FALSE: &[&str] = &["false", "no", "n", "off"];
    match n {
        Node::Bool(b) => Ok(*b),
        Node::Str(s) if TRUE.iter().any(|t| s.eq_ignore_ascii_case(t)) => Ok(true),
        Node::Str(s) if FALSE.iter().any(|f| s.eq_ignore_ascii_case(f)) => Ok(false),
        Node::Str(s) => Err(format!(
            "expected true or false (or yes/no, on/off), found '{}'",
            s.escape_debug()
        )),
        other => Err(format!("expected true or false, found {}", other.kind())),
    }
}

/// A whole number, not negative.
pub(crate) fn uint(n: &Node) -> Result<u64, String> {
    match n {
        Node::Int(i) if *i < 0 => Err("must not be negative".into()),
        Node::Int(i) => u64::try_from(*i).map_err(|_| "is too large".into()),
        Node::Str(s)
            if s.trim().starts_with('-') && s.trim()[1..].chars().all(|c| c.is_ascii_digit()) =>
        {
            Err("must not be negative".into())
        }
        Node::Str(s) => s
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("expected a whole number, found '{s}'")),
        other => Err(format!("expected a whole number, found {}", other.kind())),
    }
}

/// A whole number, possibly negative.
pub(super) fn int(n: &Node) -> Result<i64, String> {
    match n {
        Node::Int(i) => i64::try_from(*i).map_err(|_| "is too large".into()),
        Node::Str(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("expected a whole number, found '{s}'")),
        other => Err(format!("expected a whole number, found {}", other.kind())),
    }
}

/// A whole number that fits in 32 bits.
pub(super) fn u32_of(n: &Node) -> Result<u32, String> {
    let v = uint(n)?;
    u32::try_from(v).map_err(|_| "is too large".into())
}

/// A number, whole or not.
pub(super) fn number(n: &Node) -> Result<f64, String> {
    match n {
        Node::Int(i) => Ok(*i as f64),
        Node::Float(f) => Ok(*f),
        Node::Str(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| format!("expected a number, found '{s}'")),
        other => Err(format!("expected a number, found {}", other.kind())),
    }
}

/// A list of scalars, as text.
pub(super) fn string_list(n: &Node) -> Result<Vec<String>, String> {
    match n {
        Node::Seq(items) => items.iter().map(text).collect(),
        other => Err(format!("expected a list, found {}", other.kind())),
    }
}

/// A duration in milliseconds; a bare number needs a unit unless it is 0.
pub(super) fn duration(n: &Node) -> Result<u64, String> {
    match n {
        Node::Int(0) => Ok(0),
        Node::Int(i) => Err(format!(
            "a duration needs a unit; write e.g. '{i}s' (units: ns, us, ms, s, m, h)"
        )),
        Node::Str(s) => parse_duration_ms(s),
        other => Err(format!(
            "expected a duration such as '10s' or '1m30s', found {}",
            other.kind()
        )),
    }
}

/// A size in bytes: a number of bytes or text with a unit (`64m`).
pub(super) fn size(n: &Node) -> Result<u64, String> {
    match n {
        Node::Int(i) if *i < 0 => Err("a size must not be negative".into()),
        Node::Int(i) => u64::try_from(*i).map_err(|_| "is too large".into()),
        Node::Str(s) => parse_size_bytes(s),
        other => Err(format!(
            "expected a size such as '64m' or '1g', found {}",
            other.kind()
        )),
    }
}

/// CPUs as nano-CPUs; `None` for 0 (no limit).
pub(super) fn cpus(n: &Node) -> Result<Option<u64>, String> {
    let text = n.scalar_text().unwrap_or_default();
    cpus_to_nano(number(n)?, &text)
}

/// A file mode: text is octal (`0440`), an integer is taken as written.
pub(super) fn mode(n: &Node) -> Result<u32, String> {
    match n {
        Node::Int(i) => {
            let v = u32::try_from(*i).map_err(|_| format!("'{i}' is not a file mode"))?;
            check_mode(v, &i.to_string())
        }
        Node::Str(s) => parse_octal_mode(s),
        other => Err(format!(
            "expected an octal file mode such as 0440, found {}",
            other.kind()
        )),
    }
}

/// A `KEY: value` mapping or a `KEY=value` list; a value of `None` is a bare `KEY` (or `KEY:`).
pub(crate) fn kv_entries(n: &Node) -> Result<Vec<(String, Option<String>)>, String> {
    match n {
        Node::Null => Ok(Vec::new()),
        Node::Map(entries) => entries
            .iter()
            .map(|(k, v)| match v {
                Node::Null => Ok((k.clone(), None)),
                v => v
                    .scalar_text()
                    .map(|t| (k.clone(), Some(t)))
                    .ok_or_else(|| format!("the value of '{k}' must be text, found {}", v.kind())),
            })
            .collect(),
        Node::Seq(items) => items
            .iter()
            .map(|item| {
                let t = item.scalar_text().ok_or_else(|| {
                    format!("list entries must be KEY=VALUE text, found {}", item.kind())
                })?;
                Ok(match t.split_once('=') {
                    Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                    None => (t, None),
                })
            })
            .collect(),
        other => Err(format!(
            "expected a mapping or a list of KEY=VALUE, found {}",
            other.kind()
        )),
    }
}

/// [`kv_entries`] with a bare `KEY` as an empty value.
pub(super) fn string_map(n: &Node) -> Result<BTreeMap<String, String>, String> {
    Ok(kv_entries(n)?
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or_default()))
        .collect())
}

/// A command as a list: a string is split like a shell would (quotes group words).
pub(super) fn command(n: &Node) -> Result<Vec<String>, String> {
    match n {
        Node::Str(s) => shlex::split(s).ok_or_else(|| {
            "cannot split the command into words: a quote is not closed".to_string()
        }),
        Node::Seq(_) => string_list(n),
        other => Err(format!(
            "expected a command as text or a list, found {}",
            other.kind()
        )),
    }
}

/// A mapping's entries (`null` as none); anything else is an error against `key`.
pub(super) fn expect_map<'n>(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &'n Node,
) -> Option<&'n [(String, Node)]> {
    match n {
        Node::Map(entries) => Some(entries),
        Node::Null => Some(&[]),
        other => {
            ctx.bad(
                key,
                other,
                format!("expected a mapping, found {}", other.kind()),
            );
            None
        }
    }
}

/// Sorted, without duplicates.
pub(super) fn sorted_unique(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}
