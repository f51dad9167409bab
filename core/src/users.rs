//! A route's users list for basic authentication: htpasswd lines (`user:hash`), where every
//! hash is bcrypt (`$2a$`, `$2b$`, `$2y$`) or argon2 (`$argon2id$`, `$argon2i$`, `$argon2d$`).
//! A plain password, `{SHA}`, `$apr1$` or `crypt` hash is refused: each is a password or is
//! cracked in seconds.
//!
//! Messages name a line by its number, never its user or hash: the list is a secret.

/// Why a users list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsersError {
    #[error("the users list is not UTF-8 text")]
    NotText,
    #[error("the users list names no user")]
    Empty,
    #[error("line {line} is not user:hash")]
    NotAUserLine { line: usize },
    #[error("line {line} names a user already named on line {first}")]
    Duplicate { line: usize, first: usize },
    #[error("line {line} has a hash that is not bcrypt or argon2 (a plain password, {{SHA}}, $apr1$ and crypt hashes are refused)")]
    WeakHash { line: usize },
    #[error("line {line} has a hash that costs more than an edge checks (bcrypt cost at most 14; argon2 at most m=262144, t=16, p=16)")]
    TooCostly { line: usize },
}

/// Whether checking `hash` stays within what an edge does per request: bcrypt cost at most 14
/// (about a second of CPU), argon2 at most 256 MiB, 16 passes and 16 lanes.
fn affordable(scheme: HashScheme, hash: &str) -> bool {
    match scheme {
        HashScheme::Bcrypt => hash[4..6].parse::<u32>().is_ok_and(|cost| cost <= 14),
        HashScheme::Argon2 => {
            let Some(params) = hash.split('$').find(|p| p.starts_with("m=")) else {
                return false;
            };
            params.split(',').all(|kv| match kv.split_once('=') {
                Some(("m", v)) => v.parse::<u32>().is_ok_and(|m| m <= 262_144),
                Some(("t", v)) => v.parse::<u32>().is_ok_and(|t| t <= 16),
                Some(("p", v)) => v.parse::<u32>().is_ok_and(|p| p <= 16),
                _ => true,
            })
        }
    }
}

/// The hash schemes a users list may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashScheme {
    Bcrypt,
    Argon2,
}

/// The scheme of a hash as a users list writes it, or `None` when it is neither bcrypt nor
/// argon2 in their standard text forms.
pub fn hash_scheme(hash: &str) -> Option<HashScheme> {
    let bcrypt = ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p))
        && hash.len() == 60
        && hash.as_bytes()[4..6].iter().all(u8::is_ascii_digit)
        && hash.as_bytes()[6] == b'$'
        && hash.as_bytes()[7..]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'.' || *b == b'/');
    if bcrypt {
        return Some(HashScheme::Bcrypt);
    }
    let argon2 = ["$argon2id$", "$argon2i$", "$argon2d$"]
        .iter()
        .any(|p| hash.starts_with(p))
        && hash.split('$').count() >= 5
        && hash
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"$=,+/.-".contains(&b));
    argon2.then_some(HashScheme::Argon2)
}

/// The users of a list, as (user, hash) in the list's order. Blank lines and lines starting
/// with `#` are skipped.
pub fn parse_users(bytes: &[u8]) -> Result<Vec<(String, String)>, UsersError> {
    let text = std::str::from_utf8(bytes).map_err(|_| UsersError::NotText)?;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut lines_of: Vec<usize> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err(UsersError::NotAUserLine { line: line_no });
        };
        if user.is_empty() || user.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(UsersError::NotAUserLine { line: line_no });
        }
        let Some(scheme) = hash_scheme(hash) else {
            return Err(UsersError::WeakHash { line: line_no });
        };
        if !affordable(scheme, hash) {
            return Err(UsersError::TooCostly { line: line_no });
        }
        if let Some(first) = out.iter().position(|(u, _)| u == user) {
            return Err(UsersError::Duplicate {
                line: line_no,
                first: lines_of[first],
            });
        }
        out.push((user.to_owned(), hash.to_owned()));
        lines_of.push(line_no);
    }
    if out.is_empty() {
        return Err(UsersError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BCRYPT: &str = "$2y$05$uSd7Zy1B0A5I0wGCFQnm5eRBcRrp/N1h4bzSbOe8pfSx5XYqBJtDa";
    const ARGON2: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHQxMjM$2uW0o0x3fW3YzQvI1vYV6B8dTgW3pxgk1C0x0s0n3Zk";

    #[test]
    fn bcrypt_and_argon2_lines_are_read_and_comments_skipped() {
        let list = format!("# staff\nalice:{BCRYPT}\n\r\nbob:{ARGON2}\r\n");
        assert_eq!(
            parse_users(list.as_bytes()).unwrap(),
            [
                ("alice".to_owned(), BCRYPT.to_owned()),
                ("bob".to_owned(), ARGON2.to_owned())
            ]
        );
    }

    #[test]
    fn weak_hashes_and_plain_passwords_are_refused_by_line() {
        for weak in [
            "hunter2",
            "{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
            "$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/",
            "rl0YzG6Yp0ycU",
            "$2y$05$short",
            "$1$saltsalt$hash",
        ] {
            let list = format!("alice:{BCRYPT}\nbob:{weak}\n");
            let err = parse_users(list.as_bytes()).unwrap_err();
            assert_eq!(err, UsersError::WeakHash { line: 2 }, "{weak}");
            assert!(!err.to_string().contains(weak) && !err.to_string().contains("bob"));
        }
    }

    #[test]
    fn hashes_costlier_than_an_edge_checks_are_refused() {
        let costly_bcrypt = BCRYPT.replace("$05$", "$15$");
        let costly_argon2 = ARGON2.replace("m=19456", "m=1048576");
        for hash in [costly_bcrypt, costly_argon2] {
            assert_eq!(
                parse_users(format!("alice:{hash}").as_bytes()),
                Err(UsersError::TooCostly { line: 1 }),
                "{hash}"
            );
        }
        let at_most = format!("alice:{}", BCRYPT.replace("$05$", "$14$"));
        assert!(parse_users(at_most.as_bytes()).is_ok());
    }

    #[test]
    fn malformed_lists_are_refused() {
        assert_eq!(parse_users(b"\n# none\n"), Err(UsersError::Empty));
        assert_eq!(parse_users(b"\xff"), Err(UsersError::NotText));
        assert_eq!(
            parse_users(b"alice\n"),
            Err(UsersError::NotAUserLine { line: 1 })
        );
        assert_eq!(
            parse_users(format!(":{BCRYPT}").as_bytes()),
            Err(UsersError::NotAUserLine { line: 1 })
        );
        assert_eq!(
            parse_users(format!("a:{BCRYPT}\n\na:{ARGON2}").as_bytes()),
            Err(UsersError::Duplicate { line: 3, first: 1 })
        );
    }
}
