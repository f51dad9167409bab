//! Service Gates: what the edges do with a Service's requests besides routing them to its
//! Serving Containers: answer them with a maintenance page, or hold them for a while.

use serde::{Deserialize, Serialize};

use crate::{ServiceId, ServiceName};

/// The longest maintenance message, in bytes.
pub const MAX_GATE_MESSAGE: usize = 1024;

/// The longest a Service's requests may be held (`ployz service pause --for`), in seconds.
pub const MAX_PAUSE_SECONDS: u64 = 300;

/// A gate on one Service, kept cluster-scoped in the store until it is lifted
/// (`ployz service live` / `resume`). Every Machine's edge applies it to every route of the
/// Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceGate {
    pub service_id: ServiceId,
    pub service_name: ServiceName,
    pub state: GateState,
    /// Who set it (`user@host`).
    pub set_by: String,
    /// When, milliseconds since the Unix epoch.
    pub set_at_ms: u64,
}

/// What the edges do with the Service's requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "gate", rename_all = "snake_case")]
pub enum GateState {
    /// Answered `503` with a page carrying `message`; no request reaches a container.
    Maintenance { message: String },
    /// New requests wait at the edge until the gate is lifted or `until_ms` (Unix epoch, on
    /// the clock of the Machine that set it) passes, then go on to the Serving Containers of
    /// then.
    Paused { until_ms: u64 },
}

impl GateState {
    /// Checks a gate a person asked for: the message is one paragraph of text of at most
    /// [`MAX_GATE_MESSAGE`] bytes. The error names the field and the fix.
    pub fn check(&self) -> Result<(), String> {
        match self {
            GateState::Maintenance { message } => {
                if message.len() > MAX_GATE_MESSAGE {
                    return Err(format!(
                        "message: {} bytes, more than {MAX_GATE_MESSAGE}; shorten it",
                        message.len()
                    ));
                }
                if message.chars().any(|c| c.is_control() && c != '\n') {
                    return Err(
                        "message: holds control characters; write plain text (new lines are kept)"
                            .to_owned(),
                    );
                }
                Ok(())
            }
            GateState::Paused { .. } => Ok(()),
        }
    }
}

/// The page a Service in maintenance answers with: `message` (HTML-escaped) in a minimal
/// document, or a default line when it is empty.
pub fn maintenance_page(message: &str) -> String {
    let text = if message.trim().is_empty() {
        "This service is down for maintenance. Please try again shortly."
    } else {
        message
    };
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '&' => escaped.push_str("&amp;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            '\n' => escaped.push_str("<br>"),
            c => escaped.push(c),
        }
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Down for maintenance</title></head>\n<body><h1>Down for maintenance</h1>\n<p>{escaped}</p>\n</body></html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_escapes_the_message_and_a_bad_message_is_refused() {
        let page = maintenance_page("back at 5 <b>&</b> \"soon\"\nthanks");
        assert!(
            page.contains("<p>back at 5 &lt;b&gt;&amp;&lt;/b&gt; &quot;soon&quot;<br>thanks</p>"),
            "{page}"
        );
        assert!(maintenance_page("").contains("down for maintenance"));
        let long = GateState::Maintenance {
            message: "x".repeat(MAX_GATE_MESSAGE + 1),
        };
        assert!(long.check().unwrap_err().starts_with("message: 1025 bytes"));
        let ctl = GateState::Maintenance {
            message: "a\u{1b}[31m".into(),
        };
        assert!(ctl.check().unwrap_err().contains("control characters"));
        assert!(GateState::Maintenance {
            message: "two\nlines".into()
        }
        .check()
        .is_ok());
    }
}
