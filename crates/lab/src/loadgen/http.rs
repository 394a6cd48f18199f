//! The minimal HTTP/1.1 the load generator speaks: one `GET` request form, and a parser of
//! response heads that works on whatever prefix of the stream has arrived so far.
//!
//! Bodies must be delimited by `Content-Length` (what nginx sends for static files);
//! chunked transfer coding and read-until-close bodies are rejected, with a message that
//! says so, rather than misread.

use std::fmt;

/// Largest response head accepted; a longer one is malformed.
pub const MAX_HEAD: usize = 64 * 1024;

/// The bytes of a keep-alive `GET path` request to `host`.
pub fn request(host: &str, path: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: cheetah-loadgen\r\n\
         Accept: */*\r\nConnection: keep-alive\r\n\r\n"
    )
    .into_bytes()
}

/// A parsed response head: status line and header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    pub status: u16,
    pub reason: String,
    /// Fields in arrival order, names as sent.
    pub headers: Vec<(String, String)>,
}

/// Why a response head is malformed or unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// No end of head within [`MAX_HEAD`] bytes.
    TooLarge,
    BadStatusLine(String),
    BadHeader(String),
    /// `Transfer-Encoding` present: not supported by this client.
    Chunked,
    /// Neither `Content-Length` nor `Transfer-Encoding`: the body would run to the close.
    NoContentLength,
    BadContentLength(String),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::TooLarge => write!(f, "response head longer than {MAX_HEAD} bytes"),
            ParseError::BadStatusLine(line) => write!(f, "bad status line {line:?}"),
            ParseError::BadHeader(line) => write!(f, "bad header line {line:?}"),
            ParseError::Chunked => {
                write!(f, "Transfer-Encoding responses (chunked) are not supported")
            }
            ParseError::NoContentLength => write!(f, "response without Content-Length"),
            ParseError::BadContentLength(value) => write!(f, "bad Content-Length {value:?}"),
        }
    }
}

impl Head {
    /// The first field named `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body length the head announces. Several `Content-Length` fields must agree.
    pub fn content_length(&self) -> Result<u64, ParseError> {
        if self.header("transfer-encoding").is_some() {
            return Err(ParseError::Chunked);
        }
        let mut length = None;
        for (_, value) in self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        {
            let parsed = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                value.parse::<u64>().ok()
            } else {
                None
            };
            match (parsed, length) {
                (None, _) => return Err(ParseError::BadContentLength(value.clone())),
                (Some(n), Some(m)) if n != m => {
                    return Err(ParseError::BadContentLength(value.clone()))
                }
                (Some(n), _) => length = Some(n),
            }
        }
        length.ok_or(ParseError::NoContentLength)
    }

    /// Whether the server keeps the connection open after this response.
    pub fn keep_alive(&self) -> bool {
        let has_token = |token: &str| {
            self.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
                .flat_map(|(_, v)| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if self.minor == 0 {
            has_token("keep-alive")
        } else {
            !has_token("close")
        }
    }
}

/// Parses the response head at the start of `buf`. `Ok(None)`: the head is not complete yet
/// (read more and call again with the longer buffer). `Ok(Some((head, n)))`: the head took
/// the first `n` bytes; the body starts at `buf[n]`.
pub fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, ParseError> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > MAX_HEAD {
            Err(ParseError::TooLarge)
        } else {
            Ok(None)
        };
    };
    if end + 4 > MAX_HEAD {
        return Err(ParseError::TooLarge);
    }
    let mut lines = buf[..end].split(|&b| b == b'\n').map(|line| {
        // Every line but the last ends in "\r\n"; the head's end "\r\n\r\n" cut the last.
        line.strip_suffix(b"\r").unwrap_or(line)
    });
    let status_line = lines.next().unwrap_or_default();
    let (minor, status, reason) = parse_status_line(status_line)
        .ok_or_else(|| ParseError::BadStatusLine(lossy(status_line)))?;
    let mut headers = Vec::new();
    for line in lines {
        headers.push(parse_header(line).ok_or_else(|| ParseError::BadHeader(lossy(line)))?);
    }
    let head = Head {
        minor,
        status,
        reason,
        headers,
    };
    Ok(Some((head, end + 4)))
}

/// `HTTP/1.x SSS reason`; the reason may be empty, the space before it may be missing.
fn parse_status_line(line: &[u8]) -> Option<(u8, u16, String)> {
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let (&minor, rest) = rest.split_first()?;
    let minor = match minor {
        b'0' => 0,
        b'1' => 1,
        _ => return None,
    };
    let rest = rest.strip_prefix(b" ")?;
    if rest.len() < 3 || !rest[..3].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let status = std::str::from_utf8(&rest[..3]).ok()?.parse().ok()?;
    if !(100..=599).contains(&status) {
        return None;
    }
    let reason = match &rest[3..] {
        [] => String::new(),
        [b' ', reason @ ..] => lossy(reason),
        _ => return None,
    };
    if reason.contains('\r') {
        return None;
    }
    Some((minor, status, reason))
}

/// `name: value`, the name a token, the value trimmed of spaces and tabs.
fn parse_header(line: &[u8]) -> Option<(String, String)> {
    let colon = line.iter().position(|&b| b == b':')?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
        return None;
    }
    if value.contains(&b'\r') {
        return None;
    }
    let value = trim(value);
    Some((lossy(name), lossy(value)))
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NGINX: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.24.0\r\n\
        Date: Mon, 01 Jan 2024 00:00:00 GMT\r\nContent-Type: application/octet-stream\r\n\
        Content-Length: 1024\r\nConnection: keep-alive\r\nX-Server: s3\r\n\r\n";

    fn parse(bytes: &[u8]) -> Result<Option<(Head, usize)>, ParseError> {
        parse_head(bytes)
    }

    #[test]
    fn parses_an_nginx_head() {
        let mut bytes = NGINX.to_vec();
        bytes.extend_from_slice(b"body");
        let (head, used) = parse(&bytes).unwrap().unwrap();
        assert_eq!(used, NGINX.len());
        assert_eq!(
            (head.minor, head.status, head.reason.as_str()),
            (1, 200, "OK")
        );
        assert_eq!(head.header("x-server"), Some("s3"));
        assert_eq!(head.content_length(), Ok(1024));
        assert!(head.keep_alive());
    }

    #[test]
    fn header_names_are_case_insensitive() {
        let bytes = b"HTTP/1.1 200 OK\r\nx-SERVER:s1 \r\ncontent-LENGTH: \t7\r\n\r\n";
        let (head, _) = parse(bytes).unwrap().unwrap();
        assert_eq!(head.header("X-Server"), Some("s1"));
        assert_eq!(head.header("Content-Length"), Some("7"));
        assert_eq!(head.content_length(), Ok(7));
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        for end in 0..NGINX.len() {
            assert_eq!(parse(&NGINX[..end]), Ok(None), "prefix of {end} bytes");
        }
    }

    #[test]
    fn bad_status_lines_are_rejected() {
        for line in [
            "HTTP/2 200 OK",
            "HTTP/1.1 20 OK",
            "HTTP/1.1 2000 OK",
            "HTTP/1.1 OK",
            "HTTP/1.1  200 OK",
            "HTTP/1.2 200 OK",
            "http/1.1 200 OK",
            "HTTP/1.1 999 Nope",
            "ICY 200 OK",
            "",
            "garbage",
        ] {
            let bytes = format!("{line}\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(
                parse(bytes.as_bytes()),
                Err(ParseError::BadStatusLine(line.into())),
                "{line:?}"
            );
        }
        // An empty reason phrase is allowed, with or without its space.
        for line in ["HTTP/1.1 200", "HTTP/1.1 200 ", "HTTP/1.0 404 Not Found"] {
            let bytes = format!("{line}\r\n\r\n");
            assert!(parse(bytes.as_bytes()).unwrap().is_some(), "{line:?}");
        }
    }

    #[test]
    fn bad_header_lines_are_rejected() {
        for line in [
            "no colon",
            ": empty name",
            "bad name: x",
            " folded: x",
            "a\rb: c",
        ] {
            let bytes = format!("HTTP/1.1 200 OK\r\n{line}\r\n\r\n");
            assert_eq!(
                parse(bytes.as_bytes()),
                Err(ParseError::BadHeader(line.into()))
            );
        }
    }

    #[test]
    fn body_framing() {
        let head = |fields: &str| {
            let bytes = format!("HTTP/1.1 200 OK\r\n{fields}\r\n");
            parse(bytes.as_bytes()).unwrap().unwrap().0
        };
        assert_eq!(
            head("Transfer-Encoding: chunked\r\n").content_length(),
            Err(ParseError::Chunked)
        );
        assert_eq!(
            head("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n").content_length(),
            Err(ParseError::Chunked)
        );
        assert_eq!(head("").content_length(), Err(ParseError::NoContentLength));
        assert_eq!(
            head("Content-Length: -1\r\n").content_length(),
            Err(ParseError::BadContentLength("-1".into()))
        );
        assert_eq!(
            head("Content-Length: 3\r\nContent-Length: 4\r\n").content_length(),
            Err(ParseError::BadContentLength("4".into()))
        );
        assert_eq!(
            head("Content-Length: 3\r\ncontent-length: 3\r\n").content_length(),
            Ok(3)
        );
    }

    #[test]
    fn keep_alive_rules() {
        let head = |status: &str, fields: &str| {
            let bytes = format!("{status}\r\n{fields}\r\n");
            parse(bytes.as_bytes()).unwrap().unwrap().0
        };
        assert!(head("HTTP/1.1 200 OK", "").keep_alive());
        assert!(!head("HTTP/1.1 200 OK", "Connection: Close\r\n").keep_alive());
        assert!(!head("HTTP/1.1 200 OK", "Connection: upgrade, close\r\n").keep_alive());
        assert!(!head("HTTP/1.0 200 OK", "").keep_alive());
        assert!(head("HTTP/1.0 200 OK", "Connection: Keep-Alive\r\n").keep_alive());
    }

    #[test]
    fn oversized_heads_are_rejected() {
        let mut bytes = b"HTTP/1.1 200 OK\r\n".to_vec();
        while bytes.len() <= MAX_HEAD {
            bytes.extend_from_slice(b"X-Filler: 0123456789abcdef\r\n");
        }
        assert_eq!(parse(&bytes), Err(ParseError::TooLarge));
        bytes.extend_from_slice(b"\r\n");
        assert_eq!(parse(&bytes), Err(ParseError::TooLarge));
    }

    proptest! {
        /// Fed in arbitrary pieces, the parser asks for more until the whole head is there,
        /// then parses exactly what it parses from one piece.
        #[test]
        fn any_split_parses_like_one_read(
            cuts in proptest::collection::vec(0..NGINX.len(), 0..8),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = NGINX.to_vec();
            bytes.extend_from_slice(&body);
            let whole = parse(&bytes).unwrap().unwrap();
            let mut cuts = cuts;
            cuts.sort_unstable();
            for cut in cuts {
                prop_assert_eq!(parse(&bytes[..cut]), Ok(None));
            }
            prop_assert_eq!(parse(&bytes).unwrap().unwrap(), whole);
        }

        /// Arbitrary bytes never panic the parser, and whatever it accepts ends on the
        /// head's blank line.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert_eq!(&bytes[used - 4..used], b"\r\n\r\n");
            }
        }

        /// Header names match whatever their case.
        #[test]
        fn any_case_of_a_name_matches(mask in any::<u32>()) {
            let name: String = "x-server"
                .chars()
                .enumerate()
                .map(|(i, c)| if mask >> i & 1 == 1 { c.to_ascii_uppercase() } else { c })
                .collect();
            let bytes = format!("HTTP/1.1 200 OK\r\n{name}: s9\r\nContent-Length: 0\r\n\r\n");
            let (head, _) = parse(bytes.as_bytes()).unwrap().unwrap();
            prop_assert_eq!(head.header("X-Server"), Some("s9"));
        }
    }
}
