//! An error as one line with what caused it.

/// `e` and each of its causes, joined by `: `; a cause whose text the line already holds (many
/// errors repeat their source in their own message) is not repeated. Clients such as bollard's
/// and reqwest's say "error sending request" and leave why (refused, reset, timed out) to
/// their source.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(std::io::Error, &'static str);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.1)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_reads_with_its_causes_each_once() {
        let refused = || std::io::Error::other("connection refused");
        assert_eq!(
            error_chain(&Wrapped(refused(), "client error")),
            "client error: connection refused"
        );
        assert_eq!(
            error_chain(&Wrapped(refused(), "client error: connection refused")),
            "client error: connection refused"
        );
    }
}
