//! The HTTP check (`http_path`): `GET <path>` over HTTP/1.1 on a connection of the host's
//! kernel, from the LB's own address; the status line decides (2xx and 3xx are healthy).
//! The whole check, connect included, fits in the VIP's `timeout_ms`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use super::state::ProbeOutcome;

/// The most of the answer read to find the status line.
const MAX_STATUS_LINE: usize = 1024;

/// Runs one check of `path` on `server` (blocking, at most `timeout`).
pub fn check(server: SocketAddrV4, path: &str, timeout: Duration) -> ProbeOutcome {
    let deadline = Instant::now() + timeout;
    match exchange(server, path, deadline) {
        Ok(outcome) => outcome,
        Err(e) => match e.kind() {
            io::ErrorKind::ConnectionRefused => ProbeOutcome::Refused,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ProbeOutcome::Timeout,
            _ => ProbeOutcome::Failed(format!("http: {e}")),
        },
    }
}

fn exchange(server: SocketAddrV4, path: &str, deadline: Instant) -> io::Result<ProbeOutcome> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
    };
    let mut stream = TcpStream::connect_timeout(&SocketAddr::V4(server), left()?)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(left()?))?;
    stream.write_all(request(server, path).as_bytes())?;
    let mut answer = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !answer.contains(&b'\n') && answer.len() < MAX_STATUS_LINE {
        stream.set_read_timeout(Some(left()?))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    Ok(match status(&answer) {
        Some(code) => ProbeOutcome::HttpStatus(code),
        None => ProbeOutcome::Failed("http: no status line in the answer".into()),
    })
}

/// The request: the server's own address as `Host` (a check goes to one server, not to
/// the VIP). No `Connection: close`: the LB closes as soon as it has the status line, so
/// the closing side's TIME-WAIT is the LB's, not the server's (with `close`, the server
/// would close first and keep one TIME-WAIT socket per check for a minute).
pub fn request(server: SocketAddrV4, path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {server}\r\nUser-Agent: cheetah-health-check\r\nAccept: */*\r\n\r\n"
    )
}

/// The status code of `HTTP/1.x NNN ...`.
pub fn status(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = words.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn status_lines_are_read_and_others_refused() {
        assert_eq!(status(b"HTTP/1.1 200 OK\r\nServer: x\r\n"), Some(200));
        assert_eq!(status(b"HTTP/1.0 503 Service Unavailable\r\n"), Some(503));
        assert_eq!(status(b"HTTP/1.1 204\r\n"), Some(204));
        assert_eq!(status(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status(b"HTTP/1.1 2000 OK\r\n"), None);
        assert_eq!(status(b""), None);
    }

    /// Against a real listener on loopback: its status decides, a closed port is refused,
    /// and a server that never answers times out within the timeout.
    #[test]
    fn checks_a_real_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(address) = listener.local_addr().unwrap() else {
            unreachable!()
        };
        let server = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in ["HTTP/1.1 200 OK\r\n\r\n", "HTTP/1.1 503 Busy\r\n\r\n", ""] {
                let (mut stream, _) = listener.accept().unwrap();
                let mut buf = [0u8; 512];
                let n = stream.read(&mut buf).unwrap();
                requests.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                if answer.is_empty() {
                    // Never answers: hold the connection past the check's timeout.
                    std::thread::sleep(Duration::from_millis(400));
                } else {
                    stream.write_all(answer.as_bytes()).unwrap();
                }
            }
            requests
        });
        let timeout = Duration::from_millis(200);
        assert_eq!(
            check(address, "/healthz", timeout),
            ProbeOutcome::HttpStatus(200)
        );
        assert_eq!(check(address, "/", timeout), ProbeOutcome::HttpStatus(503));
        let started = Instant::now();
        assert_eq!(check(address, "/", timeout), ProbeOutcome::Timeout);
        assert!(started.elapsed() < Duration::from_millis(350));
        let requests = server.join().unwrap();
        assert!(
            requests[0].starts_with(&format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n")),
            "{:?}",
            requests[0]
        );
        // The listener is gone: nothing listens on the port.
        assert_eq!(check(address, "/", timeout), ProbeOutcome::Refused);
    }
}
