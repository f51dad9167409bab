//! Variable interpolation (`$VAR`, `${VAR:-default}`, `$$`, ...) and `.env` / `env_file` parsing.

/// Why a text could not be interpolated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterpError {
    pub message: String,
    pub fix: Option<String>,
}

/// The result of interpolating one text: the expanded text and the variables that were used
/// without being defined (each became empty).
#[derive(Debug, Default)]
pub(crate) struct Expanded {
    pub text: String,
    pub undefined: Vec<String>,
}

/// Expands every variable reference in `text`, looking names up with `lookup`.
///
/// Forms: `$VAR`, `${VAR}`, `${VAR:-default}` (unset or empty), `${VAR-default}` (unset),
/// `${VAR:?message}` / `${VAR?message}` (an error), `${VAR:+alt}` / `${VAR+alt}`, and `$$` for a
/// literal `$`. Defaults and messages may themselves hold references.
pub(crate) fn interpolate(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Expanded, InterpError> {
    let mut out = Expanded::default();
    out.text = expand(text, lookup, &mut out.undefined, 0)?;
    Ok(out)
}

const MAX_NESTING: usize = 32;

fn expand(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    undefined: &mut Vec<String>,
    depth: usize,
) -> Result<String, InterpError> {
    if depth > MAX_NESTING {
        return Err(InterpError {
            message: "variable references are nested too deeply".into(),
            fix: None,
        });
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let mut chars = after.chars();
        match chars.next() {
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('{') => {
                let body_start = 1;
                let mut depth_braces = 1usize;
                let mut end = None;
                for (i, c) in after[body_start..].char_indices() {
                    match c {
                        '{' => depth_braces += 1,
                        '}' => {
                            depth_braces -= 1;
                            if depth_braces == 0 {
                                end = Some(body_start + i);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let Some(end) = end else {
                    return Err(InterpError {
                        message: format!("'${}' is not closed with '}}'", short(after)),
                        fix: Some(
                            "close the reference with '}', or write '$$' for a literal '$'".into(),
                        ),
                    });
                };
                let body = &after[body_start..end];
                out.push_str(&braced(body, lookup, undefined, depth)?);
                rest = &after[end + 1..];
            }
            Some(c) if c == '_' || c.is_ascii_alphabetic() => {
                let len = after
                    .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
                    .unwrap_or(after.len());
                let name = &after[..len];
                match lookup(name) {
                    Some(v) => out.push_str(&v),
                    None => note_undefined(undefined, name),
                }
                rest = &after[len..];
            }
            _ => {
                return Err(InterpError {
                    message: format!("'${}' is not a variable reference", short(after)),
                    fix: Some("write '$$' for a literal '$', or '${NAME}' for a variable".into()),
                });
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn short(s: &str) -> String {
    s.chars().take(20).collect()
}

fn note_undefined(undefined: &mut Vec<String>, name: &str) {
    if !undefined.iter().any(|n| n == name) {
        undefined.push(name.to_owned());
    }
}

fn braced(
    body: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    undefined: &mut Vec<String>,
    depth: usize,
) -> Result<String, InterpError> {
    let name_len = body
        .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
        .unwrap_or(body.len());
    let name = &body[..name_len];
    let op = &body[name_len..];
    let valid_name = name
        .chars()
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic());
    if !valid_name {
        return Err(InterpError {
            message: format!("'${{{body}}}' does not start with a variable name"),
            fix: Some(
                "names are letters, digits and '_' and start with a letter or '_'; write '$$' for a literal '$'"
                    .into(),
            ),
        });
    }
    let value = lookup(name);
    let empty_or_unset = value.as_deref().is_none_or(str::is_empty);
    let (kind, arg) = if op.is_empty() {
        ("", "")
    } else if let Some(a) = op.strip_prefix(":-") {
        (":-", a)
    } else if let Some(a) = op.strip_prefix(":?") {
        (":?", a)
    } else if let Some(a) = op.strip_prefix(":+") {
        (":+", a)
    } else if let Some(a) = op.strip_prefix('-') {
        ("-", a)
    } else if let Some(a) = op.strip_prefix('?') {
        ("?", a)
    } else if let Some(a) = op.strip_prefix('+') {
        ("+", a)
    } else {
        return Err(InterpError {
            message: format!("'${{{body}}}' is not a valid substitution"),
            fix: Some(
                "use ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message} or ${NAME?message}"
                    .into(),
            ),
        });
    };
    match kind {
        "" => match value {
            Some(v) => Ok(v),
            None => {
                note_undefined(undefined, name);
                Ok(String::new())
            }
        },
        ":-" if empty_or_unset => expand(arg, lookup, undefined, depth + 1),
        "-" if value.is_none() => expand(arg, lookup, undefined, depth + 1),
        ":-" | "-" => Ok(value.unwrap_or_default()),
        ":?" | "?" => {
            let missing = if kind == ":?" {
                empty_or_unset
            } else {
                value.is_none()
            };
            if missing {
                let msg = expand(arg, lookup, undefined, depth + 1)?;
                let what = if kind == ":?" && value.is_some() {
                    "is empty"
                } else {
                    "is not set"
                };
                let message = if msg.is_empty() {
                    format!("required variable '{name}' {what}")
                } else {
                    format!("required variable '{name}' {what}: {msg}")
                };
                Err(InterpError {
                    message,
                    fix: Some(format!(
                        "set {name} in the environment or in the project's .env file"
                    )),
                })
            } else {
                Ok(value.unwrap_or_default())
            }
        }
        ":+" if !empty_or_unset => expand(arg, lookup, undefined, depth + 1),
        "+" if value.is_some() => expand(arg, lookup, undefined, depth + 1),
        _ => Ok(String::new()),
    }
}

/// One `KEY=VALUE` (value `Some`) or bare `KEY` (value `None`: taken from the environment) entry.
pub(crate) type EnvEntry = (String, Option<String>);

/// A problem on one line of an env file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvFileError {
    pub line: usize,
    pub message: String,
}

/// Parses a `.env` / `env_file` text: `KEY=VALUE` lines, `# comments`, blank lines, an optional
/// `export ` prefix, single quotes (literal), double quotes (escapes `\n \t \" \\`, may span
/// lines). Unquoted and double-quoted values are interpolated with `lookup`, then with the
/// entries above them. Returns the entries and the undefined variables that became empty.
pub(crate) fn parse_env_file(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<EnvEntry>, Vec<String>), EnvFileError> {
    let mut entries: Vec<EnvEntry> = Vec::new();
    let mut undefined = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line_no = i + 1;
        let line = lines[i].trim_start_matches('\u{feff}').trim();
        i += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line
            .strip_prefix("export ")
            .map(str::trim_start)
            .unwrap_or(line);
        let Some((key, raw)) = line.split_once('=') else {
            check_env_key(line, line_no)?;
            entries.push((line.to_owned(), None));
            continue;
        };
        let key = key.trim();
        check_env_key(key, line_no)?;
        let raw = raw.trim_start();
        let (value, interpolate_it) = if let Some(body) = raw.strip_prefix('\'') {
            match body.find('\'') {
                Some(end) => (body[..end].to_owned(), false),
                None => {
                    return Err(EnvFileError {
                        line: line_no,
                        message: format!("the value of '{key}' opens a ' quote that is not closed"),
                    })
                }
            }
        } else if let Some(body) = raw.strip_prefix('"') {
            let mut buf = body.to_owned();
            loop {
                if let Some(v) = unescape_double(&buf) {
                    break (v, true);
                }
                if i >= lines.len() {
                    return Err(EnvFileError {
                        line: line_no,
                        message: format!(
                            "the value of '{key}' opens a \" quote that is not closed"
                        ),
                    });
                }
                buf.push('\n');
                buf.push_str(lines[i]);
                i += 1;
            }
        } else {
            let v = match raw.find(" #") {
                Some(pos) => &raw[..pos],
                None => raw,
            };
            (v.trim_end().to_owned(), true)
        };
        let value = if interpolate_it {
            let local = |name: &str| {
                lookup(name).or_else(|| {
                    entries
                        .iter()
                        .rev()
                        .find(|(k, v)| k == name && v.is_some())
                        .and_then(|(_, v)| v.clone())
                })
            };
            let expanded = interpolate(&value, &local).map_err(|e| EnvFileError {
                line: line_no,
                message: format!("'{key}': {}", e.message),
            })?;
            for u in expanded.undefined {
                note_undefined(&mut undefined, &u);
            }
            expanded.text
        } else {
            value
        };
        entries.push((key.to_owned(), Some(value)));
    }
    Ok((entries, undefined))
}

fn check_env_key(key: &str, line: usize) -> Result<(), EnvFileError> {
    if key.is_empty() || key.chars().any(|c| c.is_whitespace()) {
        return Err(EnvFileError {
            line,
            message: format!("'{key}' is not a variable name; lines are KEY=VALUE"),
        });
    }
    Ok(())
}

/// The content of a double-quoted value up to its closing quote, unescaped; `None` when the
/// closing quote is not in `s`. Whatever follows the closing quote (a comment) is ignored.
fn unescape_double(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => return None,
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            "PORT" => Some("8080".into()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<(String, Vec<String>), String> {
        interpolate(text, &env)
            .map(|e| (e.text, e.undefined))
            .map_err(|e| e.message)
    }

    #[test]
    fn every_form_expands() {
        let cases = [
            ("plain", "plain"),
            ("$SET", "value"),
            ("${SET}", "value"),
            ("a-${SET}-b", "a-value-b"),
            ("${EMPTY:-d}", "d"),
            ("${EMPTY-d}", ""),
            ("${UNSET-d}", "d"),
            ("${UNSET:-d}", "d"),
            ("${UNSET:-${PORT}}", "8080"),
            ("${SET:+alt}", "alt"),
            ("${EMPTY:+alt}", ""),
            ("${EMPTY+alt}", "alt"),
            ("${UNSET+alt}", ""),
            ("$$SET", "$SET"),
            ("cost: $$5", "cost: $5"),
            ("${SET:?must}", "value"),
            ("$SET.x", "value.x"),
            ("ünïcode $SET", "ünïcode value"),
        ];
        for (input, want) in cases {
            assert_eq!(run(input).unwrap().0, want, "{input}");
        }
    }

    #[test]
    fn undefined_variables_become_empty_and_are_named() {
        assert_eq!(
            run("a${NOPE}b$ALSO").unwrap(),
            (
                "ab".to_string(),
                vec!["NOPE".to_string(), "ALSO".to_string()]
            )
        );
        assert_eq!(run("${NOPE:-x}").unwrap().1, Vec::<String>::new());
    }

    #[test]
    fn broken_references_are_errors() {
        assert_eq!(
            run("${DB_PASS:?set the database password}").unwrap_err(),
            "required variable 'DB_PASS' is not set: set the database password"
        );
        assert!(run("${EMPTY:?x}").unwrap_err().contains("is empty"));
        assert!(run("${EMPTY?x}").is_ok());
        assert!(run("${UNCLOSED").unwrap_err().contains("not closed"));
        assert!(run("$1").unwrap_err().contains("not a variable reference"));
        assert!(run("trailing $")
            .unwrap_err()
            .contains("not a variable reference"));
        assert!(run("${1X}")
            .unwrap_err()
            .contains("does not start with a variable name"));
        assert!(run("${A*b}")
            .unwrap_err()
            .contains("not a valid substitution"));
    }

    #[test]
    fn env_files_parse_quotes_comments_and_references() {
        let text = "# comment\n\nexport A=1\nB = two words # note\nC='lit $SET'\nD=\"x\\ny $SET\"\nE=${A}-$B\nBARE\nF=\"multi\nline\"\n";
        let (entries, undefined) = parse_env_file(text, &env).unwrap();
        let want: Vec<EnvEntry> = vec![
            ("A".into(), Some("1".into())),
            ("B".into(), Some("two words".into())),
            ("C".into(), Some("lit $SET".into())),
            ("D".into(), Some("x\ny value".into())),
            ("E".into(), Some("1-two words".into())),
            ("BARE".into(), None),
            ("F".into(), Some("multi\nline".into())),
        ];
        assert_eq!(entries, want);
        assert!(undefined.is_empty());
        let err = parse_env_file("OK=1\nBAD KEY=2\n", &env).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(parse_env_file("X=\"open\n", &env).is_err());
    }
}
