//! What broke a connection: the kinds the report counts, and how socket errors map to them.

use std::fmt;
use std::io;

/// Why a connection counts as broken. `as_str` is the name the report uses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BreakKind {
    /// A RST: `ECONNRESET` on a read or write.
    Reset,
    /// The connect was refused (a RST answered the SYN).
    Refused,
    /// A request was not answered (or a body stopped arriving) within `--request-timeout`.
    Timeout,
    /// The connect did not complete within `--request-timeout`.
    ConnectTimeout,
    /// A response named a different server (`X-Server`) than the first on the connection.
    ServerChanged,
    /// A status other than 200, a malformed head, or bytes the client did not ask for.
    BadResponse,
    /// The connection closed before the body had `Content-Length` bytes.
    Truncated,
    /// The server closed the connection (FIN) without announcing it with
    /// `Connection: close`: before a response, or while the connection was idle.
    Closed,
    /// Any other socket error, by its `io::ErrorKind` in snake case (`broken_pipe`,
    /// `host_unreachable`, ...) or `os_error_<errno>` when the kind says nothing.
    Io(String),
}

impl BreakKind {
    pub fn as_str(&self) -> &str {
        match self {
            BreakKind::Reset => "reset",
            BreakKind::Refused => "refused",
            BreakKind::Timeout => "timeout",
            BreakKind::ConnectTimeout => "connect_timeout",
            BreakKind::ServerChanged => "server_changed",
            BreakKind::BadResponse => "bad_response",
            BreakKind::Truncated => "truncated",
            BreakKind::Closed => "closed",
            BreakKind::Io(name) => name,
        }
    }

    /// The kind of a socket error.
    pub fn of_io(error: &io::Error) -> BreakKind {
        match error.kind() {
            io::ErrorKind::ConnectionReset => BreakKind::Reset,
            io::ErrorKind::ConnectionRefused => BreakKind::Refused,
            kind => {
                let name = format!("{kind:?}");
                // `Other` and the unstable `Uncategorized` say nothing: name the errno.
                match (name.as_str(), error.raw_os_error()) {
                    ("Other" | "Uncategorized", Some(errno)) => {
                        BreakKind::Io(format!("os_error_{errno}"))
                    }
                    ("Other" | "Uncategorized", None) => BreakKind::Io("other_io_error".into()),
                    _ => BreakKind::Io(snake_case(&name)),
                }
            }
        }
    }
}

impl fmt::Display for BreakKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One broken connection, as the connection code sees it; the session adds who and when.
#[derive(Debug, Clone)]
pub struct Break {
    pub kind: BreakKind,
    /// What happened, for people: the error text, the status, the two server names.
    pub detail: String,
}

impl Break {
    pub fn new(kind: BreakKind, detail: impl Into<String>) -> Break {
        Break {
            kind,
            detail: detail.into(),
        }
    }

    pub fn io(error: &io::Error) -> Break {
        Break::new(BreakKind::of_io(error), error.to_string())
    }
}

/// `BrokenPipe` → `broken_pipe`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_errors_map_to_kinds() {
        let of = |errno| BreakKind::of_io(&io::Error::from_raw_os_error(errno));
        assert_eq!(of(libc::ECONNRESET), BreakKind::Reset);
        assert_eq!(of(libc::ECONNREFUSED), BreakKind::Refused);
        assert_eq!(of(libc::EPIPE).as_str(), "broken_pipe");
        assert_eq!(of(libc::EHOSTUNREACH).as_str(), "host_unreachable");
        assert_eq!(of(libc::ETIMEDOUT).as_str(), "timed_out");
        let plain = io::Error::other("boom");
        assert_eq!(BreakKind::of_io(&plain).as_str(), "other_io_error");
    }
}
