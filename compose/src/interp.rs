//! Variable interpolation (`$VAR`, `${VAR:-default}`, `$$`, ...) and `.env` / `env_file` parsing.

/// Why a text could not be interpolated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterpError {
    pub message: String,
    pub fix: Option<String>,
    /// The problem in words that quote nothing of the text (`a '$' that is not a variable
    /// reference`): what an env file's messages say, since its values may be secrets.
    pub what: &'static str,
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
            what: "variable references nested too deeply",
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
                        what: "a '${' that is not closed",
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
                    what: "a '$' that is not a variable reference",
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

/// A `${...}` reference, `body` being what is between the braces.
fn braced(
    body: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    undefined: &mut Vec<String>,
    depth: usize,
) -> Result<String, InterpError> {
    let (name, kind, arg) = substitution(body)?;
    let value = lookup(name);
    let empty_or_unset = value.as_deref().is_none_or(str::is_empty);
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
                Err(required(
                    name,
                    kind,
                    arg,
                    value.is_some(),
                    lookup,
                    undefined,
                    depth,
                ))
            } else {
                Ok(value.unwrap_or_default())
            }
        }
        ":+" if !empty_or_unset => expand(arg, lookup, undefined, depth + 1),
        "+" if value.is_some() => expand(arg, lookup, undefined, depth + 1),
        _ => Ok(String::new()),
    }
}

/// Splits the body of a `${...}` reference into the name, the operator (`""`, `:-`, `:?`, `:+`,
/// `-`, `?` or `+`) and its argument.
fn substitution(body: &str) -> Result<(&str, &'static str, &str), InterpError> {
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
            what: "a '${...}' that does not start with a variable name",
        });
    }
    if op.is_empty() {
        return Ok((name, "", ""));
    }
    for kind in [":-", ":?", ":+", "-", "?", "+"] {
        if let Some(arg) = op.strip_prefix(kind) {
            return Ok((name, kind, arg));
        }
    }
    Err(InterpError {
        message: format!("'${{{body}}}' is not a valid substitution"),
        fix: Some(
            "use ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message} or ${NAME?message}"
                .into(),
        ),
        what: "a '${...}' that is not a valid substitution",
    })
}

/// The error of a `${NAME:?message}` / `${NAME?message}` whose variable is missing (`is_set`:
/// set but empty); the message may itself hold references.
fn required(
    name: &str,
    kind: &str,
    arg: &str,
    is_set: bool,
    lookup: &dyn Fn(&str) -> Option<String>,
    undefined: &mut Vec<String>,
    depth: usize,
) -> InterpError {
    let msg = match expand(arg, lookup, undefined, depth + 1) {
        Ok(m) => m,
        Err(e) => return e,
    };
    let what = if kind == ":?" && is_set {
        "is empty"
    } else {
        "is not set"
    };
    let message = if msg.is_empty() {
        format!("required variable '{name}' {what}")
    } else {
        format!("required variable '{name}' {what}: {msg}")
    };
    InterpError {
        message,
        fix: Some(format!(
            "set {name} in the environment or in the project's .env file"
        )),
        what: "a '${NAME?...}' whose variable is not set",
    }
}

/// One `KEY=VALUE` (value `Some`) or bare `KEY` (value `None`: taken from the environment) entry.
pub(crate) type EnvEntry = (String, Option<String>);

/// An entry of an env file with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvLine {
    pub line: usize,
    pub entry: EnvEntry,
}

/// A value in an env file that refers to a variable that is not set (it became empty there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnsetReference {
    pub line: usize,
    /// The entry's name, when it is one worth showing ([`shown_key`]).
    pub key: Option<String>,
}

/// A problem on one line of an env file. Its message quotes nothing from the file but a
/// variable's name: an env file's lines may be secrets (or the file not an env file at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvFileError {
    pub line: usize,
    pub message: String,
    pub fix: Option<String>,
}

/// What an env file holds: its entries and the unset variables its values referred to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ParsedEnvFile {
    pub lines: Vec<EnvLine>,
    pub unset: Vec<UnsetReference>,
}

#[cfg(test)]
impl ParsedEnvFile {
    /// The entries without their lines.
    pub fn entries(&self) -> impl Iterator<Item = &EnvEntry> + '_ {
        self.lines.iter().map(|l| &l.entry)
    }
}

/// Whether `key` is a plain variable name (letters, digits, `_`, `.`, `-`; at most 128), the
/// only kind of text from an env file that messages quote.
fn is_plain_name(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The name of a `KEY=VALUE` entry as messages show it: `'KEY'`, or a neutral phrase when the
/// name is not a plain one.
pub(crate) fn shown_key(key: Option<&str>) -> String {
    match key {
        Some(k) => format!("'{k}'"),
        None => "the entry".to_owned(),
    }
}

/// Parses a `.env` / `env_file` text: `KEY=VALUE` lines, `# comments`, blank lines, an optional
/// `export ` prefix, single quotes (literal), double quotes (escapes `\n \t \" \\`, may span
/// lines). Unquoted and double-quoted values are interpolated with `lookup`, then with the
/// entries above them. A line without `=` names a variable taken from the environment; it must
/// be a plain name. Returns the entries (with their lines) and the unset variables that became
/// empty. Nothing from the text but a plain name appears in an error.
pub(crate) fn parse_env_file(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ParsedEnvFile, EnvFileError> {
    let mut parsed = ParsedEnvFile::default();
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
            parsed.lines.push(bare_name(line, line_no)?);
            continue;
        };
        let key = key.trim();
        if key.is_empty() || key.chars().any(char::is_whitespace) {
            return Err(EnvFileError {
                line: line_no,
                message: "the name before '=' is empty or has whitespace".into(),
                fix: Some("lines are KEY=VALUE, with a name of letters, digits and '_'".into()),
            });
        }
        let shown = shown_key(is_plain_name(key).then_some(key));
        let (value, interpolate_it) = raw_value(raw.trim_start(), &shown, &lines, &mut i, line_no)?;
        let value = if interpolate_it {
            env_value(&value, key, &shown, line_no, lookup, &mut parsed)?
        } else {
            value
        };
        parsed.lines.push(EnvLine {
            line: line_no,
            entry: (key.to_owned(), Some(value)),
        });
    }
    Ok(parsed)
}

/// A line without `=`: a plain variable name, taken from the environment.
fn bare_name(line: &str, line_no: usize) -> Result<EnvLine, EnvFileError> {
    if !is_plain_name(line) {
        return Err(EnvFileError {
            line: line_no,
            message: "this line is not KEY=VALUE, nor a variable name (letters, digits, '_', '.' and '-') to take from the environment".into(),
            fix: Some("is this an env file? Lines are KEY=VALUE; '#' starts a comment".into()),
        });
    }
    Ok(EnvLine {
        line: line_no,
        entry: (line.to_owned(), None),
    })
}

/// The value after `=`, and whether it is to be interpolated: single-quoted (literal) or
/// double-quoted (unescaped), either of which may go on over the next lines (which `i` then
/// skips), or bare
/// (up to a ` #` comment).
fn raw_value(
    raw: &str,
    shown: &str,
    lines: &[&str],
    i: &mut usize,
    line_no: usize,
) -> Result<(String, bool), EnvFileError> {
    if let Some(body) = raw.strip_prefix('\'') {
        // Literal, and like a double-quoted value it may go on over the next lines (a key in
        // PEM form).
        let mut buf = body.to_owned();
        loop {
            if let Some(end) = buf.find('\'') {
                buf.truncate(end);
                return Ok((buf, false));
            }
            if *i >= lines.len() {
                return Err(EnvFileError {
                    line: line_no,
                    message: format!("the value of {shown} opens a ' quote that is not closed"),
                    fix: None,
                });
            }
            buf.push('\n');
            buf.push_str(lines[*i]);
            *i += 1;
        }
    }
    if let Some(body) = raw.strip_prefix('"') {
        let mut buf = body.to_owned();
        loop {
            if let Some(v) = unescape_double(&buf) {
                return Ok((v, true));
            }
            if *i >= lines.len() {
                return Err(EnvFileError {
                    line: line_no,
                    message: format!("the value of {shown} opens a \" quote that is not closed"),
                    fix: None,
                });
            }
            buf.push('\n');
            buf.push_str(lines[*i]);
            *i += 1;
        }
    }
    let v = match raw.find(" #") {
        Some(pos) => &raw[..pos],
        None => raw,
    };
    Ok((v.trim_end().to_owned(), true))
}

/// Interpolates a value with `lookup`, then with the entries above it; an unset variable is
/// noted in `parsed.unset`.
fn env_value(
    value: &str,
    key: &str,
    shown: &str,
    line_no: usize,
    lookup: &dyn Fn(&str) -> Option<String>,
    parsed: &mut ParsedEnvFile,
) -> Result<String, EnvFileError> {
    let local = |name: &str| {
        lookup(name).or_else(|| {
            parsed
                .lines
                .iter()
                .rev()
                .find(|l| l.entry.0 == name && l.entry.1.is_some())
                .and_then(|l| l.entry.1.clone())
        })
    };
    let expanded = interpolate(value, &local).map_err(|e| EnvFileError {
        line: line_no,
        message: format!("the value of {shown} has {}", e.what),
        fix: Some(
            "write '$$' for a literal '$', or quote the value with '...' to keep it as written"
                .into(),
        ),
    })?;
    if !expanded.undefined.is_empty() {
        parsed.unset.push(UnsetReference {
            line: line_no,
            key: is_plain_name(key).then(|| key.to_owned()),
        });
    }
    Ok(expanded.text)
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
        let parsed = parse_env_file(text, &env).unwrap();
        let entries: Vec<EnvEntry> = parsed.entries().cloned().collect();
        let undefined = parsed.unset;
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
        assert!(parse_env_file("X='open\nstill open\n", &env).is_err());
        // A single-quoted value over several lines, kept as written, $ included.
        let pem = parse_env_file(
            "KEY='-----BEGIN KEY-----\nab$cd\n-----END KEY-----'\nB=2\n",
            &env,
        )
        .unwrap();
        assert_eq!(
            pem.entries().cloned().collect::<Vec<_>>(),
            vec![
                (
                    "KEY".into(),
                    Some("-----BEGIN KEY-----\nab$cd\n-----END KEY-----".into())
                ),
                ("B".into(), Some("2".into())),
            ]
        );
        assert_eq!(pem.lines.iter().map(|l| l.line).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(
            parse_env_file("A=1\n\nB=2\n", &env)
                .unwrap()
                .lines
                .iter()
                .map(|l| l.line)
                .collect::<Vec<_>>(),
            [1, 3]
        );
    }

    #[test]
    fn env_file_errors_quote_no_value() {
        let secret = "hunter2-s3cr3t";
        for (text, line) in [
            (format!("root:{secret}:19000:0:99999:7:::\n"), 1),
            (format!("A=1\n{secret} x\n"), 2),
            (format!("PASSWORD={secret}${{\n"), 1),
            (format!("PASSWORD={secret}$'\n"), 1),
            (format!("PASSWORD='{secret}\n"), 1),
            (format!("A=1\nPASSWORD=\"{secret}\n"), 2),
            (format!("{secret}:x=1${{{secret}\n"), 1),
        ] {
            let e = parse_env_file(&text, &env).unwrap_err();
            assert_eq!(e.line, line, "{text:?}");
            assert!(!e.message.contains(secret), "{}", e.message);
            assert!(!e.message.contains("hunter2"), "{}", e.message);
            assert!(!e.fix.unwrap_or_default().contains(secret));
        }
        let unset = parse_env_file(&format!("A=1\nPASSWORD=ab$cd{secret}\n"), &env)
            .unwrap()
            .unset;
        assert_eq!(
            unset,
            [UnsetReference {
                line: 2,
                key: Some("PASSWORD".into())
            }]
        );
    }
}
