//! How the CLI reaches a daemon: `unix:///path` or `ssh://user@host[:port]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The daemon socket used when nothing else is said.
pub const DEFAULT_SOCKET: &str = "/run/ployz/ployz.sock";

/// One way to reach a daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// The daemon's unix socket on this system.
    Unix(PathBuf),
    /// The system `ssh` to a host, running `ployz dial-stdio` there.
    Ssh(SshTarget),
}

/// Where `ssh` goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    /// The daemon socket on the far side, when not the default.
    pub remote_socket: Option<String>,
    /// A private key for `ssh -i`.
    pub key_file: Option<PathBuf>,
}

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Connection::Unix(p) => write!(f, "unix://{}", p.display()),
            Connection::Ssh(t) => {
                f.write_str("ssh://")?;
                if let Some(u) = &t.user {
                    write!(f, "{u}@")?;
                }
                if t.host.contains(':') {
                    write!(f, "[{}]", t.host)?;
                } else {
                    f.write_str(&t.host)?;
                }
                if let Some(p) = t.port {
                    write!(f, ":{p}")?;
                }
                if let Some(s) = &t.remote_socket {
                    write!(f, "?socket={s}")?;
                }
                Ok(())
            }
        }
    }
}

/// Why a connection text is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadConnection {
    value: String,
    why: String,
}

impl fmt::Display for BadConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "connection '{}' is not usable: {}; write unix:///path/to/ployz.sock or ssh://user@host[:port]",
            self.value, self.why
        )
    }
}

impl std::error::Error for BadConnection {}

impl FromStr for Connection {
    type Err = BadConnection;
    fn from_str(s: &str) -> Result<Connection, BadConnection> {
        let bad = |why: &str| BadConnection {
            value: s.to_owned(),
            why: why.to_owned(),
        };
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(bad("a unix socket path must be absolute (unix:///run/...)"));
            }
            return Ok(Connection::Unix(PathBuf::from(path)));
        }
        let rest = if let Some(rest) = s.strip_prefix("ssh://") {
            rest
        } else if s.contains("://") {
            return Err(bad("the scheme must be unix:// or ssh://"));
        } else {
            s
        };
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let mut remote_socket = None;
        if let Some(q) = query {
            for pair in q.split('&') {
                match pair.split_once('=') {
                    Some(("socket", v)) if v.starts_with('/') => remote_socket = Some(v.to_owned()),
                    _ => return Err(bad(&format!("unknown option '{pair}' (only socket=/path)"))),
                }
            }
        }
        let authority = authority.trim_end_matches('/');
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) if !u.is_empty() => (Some(u.to_owned()), h),
            Some(_) => return Err(bad("the user before '@' is empty")),
            None => (None, authority),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(bad("unexpected text after ']'")),
            };
            (host, port)
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad(&format!("port '{p}' is not a number from 1 to 65535")))?,
            ),
            None => None,
        };
        Ok(Connection::Ssh(SshTarget {
            user,
            host: host.to_owned(),
            port,
            remote_socket,
            key_file: None,
        }))
    }
}

/// A connection as the config file stores it: one of `unix` or `ssh`, plus options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix: Option<PathBuf>,
    /// `user@host[:port]`, optionally with `?socket=/path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_file: Option<PathBuf>,
}

impl ConnectionConfig {
    /// The connection this entry describes.
    pub fn to_connection(&self) -> Result<Connection, BadConnection> {
        match (&self.unix, &self.ssh) {
            (Some(path), None) => format!("unix://{}", path.display()).parse(),
            (None, Some(ssh)) => {
                let text = if ssh.starts_with("ssh://") {
                    ssh.clone()
                } else {
                    format!("ssh://{ssh}")
                };
                let mut conn: Connection = text.parse()?;
                if let Connection::Ssh(t) = &mut conn {
                    t.key_file = self.ssh_key_file.clone();
                }
                Ok(conn)
            }
            _ => Err(BadConnection {
                value: format!("{self:?}"),
                why: "a connection entry needs exactly one of 'unix' or 'ssh'".into(),
            }),
        }
    }

    /// The entry for a connection.
    pub fn from_connection(conn: &Connection) -> ConnectionConfig {
        match conn {
            Connection::Unix(p) => ConnectionConfig {
                unix: Some(p.clone()),
                ssh: None,
                ssh_key_file: None,
            },
            Connection::Ssh(t) => {
                let full = conn.to_string();
                ConnectionConfig {
                    unix: None,
                    ssh: Some(full.trim_start_matches("ssh://").to_owned()),
                    ssh_key_file: t.key_file.clone(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_texts_parse_and_print_back() {
        for text in [
            "unix:///run/ployz/ployz.sock",
            "ssh://root@10.0.0.1",
            "ssh://root@127.0.0.1:2222",
            "ssh://admin@[::1]:22",
            "ssh://host.example",
            "ssh://root@h:22?socket=/tmp/p.sock",
        ] {
            let c: Connection = text.parse().unwrap();
            assert_eq!(c.to_string(), text);
        }
        let bare: Connection = "root@box:2200".parse().unwrap();
        assert_eq!(bare.to_string(), "ssh://root@box:2200");
    }

    #[test]
    fn bad_connections_say_what_to_write() {
        for (text, why) in [
            ("unix://relative.sock", "must be absolute"),
            ("tcp://h:1", "scheme must be"),
            ("ssh://root@h:99999", "port '99999'"),
            ("ssh://@h", "user before '@' is empty"),
            ("ssh://root@h?x=1", "unknown option"),
        ] {
            let err = text.parse::<Connection>().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
            assert!(err.contains("write unix:///"), "{err}");
        }
    }

    #[test]
    fn config_entries_round_trip() {
        let c: Connection = "ssh://root@h:22".parse().unwrap();
        let entry = ConnectionConfig::from_connection(&c);
        assert_eq!(entry.ssh.as_deref(), Some("root@h:22"));
        assert_eq!(entry.to_connection().unwrap(), c);
    }
}
