//! One TCP connection and the requests on it: the code that decides whether a connection
//! broke. A `Conn` is never reconnected behind the caller's back; the first thing that goes
//! wrong ends it with a [`Break`].

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout, timeout_at, Instant};

use super::breaks::{Break, BreakKind};
use super::http::{parse_head, ParseError};

/// Read buffer of a connection: a small response (head and `/small` body) in one read,
/// without making thousands of sessions costly.
const SMALL_READ: usize = 4 * 1024;
/// Read buffer once a large body is coming: `/large` streams at line rate.
const LARGE_READ: usize = 64 * 1024;
/// How long a graceful close waits for the server's FIN.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// An open connection and what has been seen on it.
pub struct Conn {
    stream: TcpStream,
    /// Bytes read but not yet parsed (part of a response head).
    buf: Vec<u8>,
    scratch: Box<[u8]>,
    pub local_port: u16,
    /// The distinct `X-Server` values seen, in order; the first is the connection's server.
    pub servers: Vec<String>,
    pub requests: u64,
}

/// A request answered in full.
pub struct Answer {
    pub server: String,
    pub latency: Duration,
    pub body_bytes: u64,
    /// The server announced it closes the connection (`Connection: close`).
    pub closing: bool,
}

/// A request that broke the connection, and how much of its body had arrived.
pub struct Failure {
    pub brk: Break,
    pub body_bytes: u64,
}

/// How a wait between requests ended.
pub enum Wake {
    Due,
    Stop,
}

impl From<Break> for Failure {
    fn from(brk: Break) -> Failure {
        Failure { brk, body_bytes: 0 }
    }
}

/// Connects, within `limit`.
pub async fn connect(addr: SocketAddr, limit: Duration) -> Result<Conn, Break> {
    let stream = match timeout(limit, TcpStream::connect(addr)).await {
        Err(_) => {
            return Err(Break::new(
                BreakKind::ConnectTimeout,
                format!("connect not done after {limit:?}"),
            ))
        }
        Ok(Err(e)) => return Err(Break::io(&e)),
        Ok(Ok(stream)) => stream,
    };
    // Requests are small and latency matters more than segment count.
    stream.set_nodelay(true).map_err(|e| Break::io(&e))?;
    let local_port = stream.local_addr().map_err(|e| Break::io(&e))?.port();
    Ok(Conn {
        stream,
        buf: Vec::new(),
        scratch: vec![0; SMALL_READ].into_boxed_slice(),
        local_port,
        servers: Vec::new(),
        requests: 0,
    })
}

impl Conn {
    /// Sends `request` and reads its whole response. The head must arrive within `limit`
    /// of sending, and each read of the body must bring bytes within `limit`.
    pub async fn exchange(&mut self, request: &[u8], limit: Duration) -> Result<Answer, Failure> {
        let sent = Instant::now();
        let deadline = sent + limit;
        match timeout_at(deadline, self.stream.write_all(request)).await {
            Err(_) => return Err(unanswered(limit, "sending the request").into()),
            Ok(Err(e)) => return Err(Break::io(&e).into()),
            Ok(Ok(())) => {}
        }
        let (head, used) = loop {
            match parse_head(&self.buf) {
                Ok(Some(parsed)) => break parsed,
                Ok(None) => {}
                Err(e) => return Err(bad(e.to_string()).into()),
            }
            let n = self
                .read(deadline, limit, "waiting for the response")
                .await?;
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    Break::new(
                        BreakKind::Closed,
                        "closed by the server before any response",
                    )
                } else {
                    bad(format!(
                        "closed by the server in the response head ({} bytes)",
                        self.buf.len()
                    ))
                }
                .into());
            }
            let chunk = &self.scratch[..n];
            self.buf.extend_from_slice(chunk);
        };
        if head.status != 200 {
            return Err(bad(format!("status {} {}", head.status, head.reason)).into());
        }
        let length = head
            .content_length()
            .map_err(|e: ParseError| bad(e.to_string()))?;
        let Some(server) = head.header("x-server").map(str::to_owned) else {
            return Err(bad("no X-Server header").into());
        };
        if let Some(first) = self.servers.first() {
            if *first != server {
                let detail = format!("X-Server {server} after {first}");
                self.servers.push(server);
                return Err(Break::new(BreakKind::ServerChanged, detail).into());
            }
        } else {
            self.servers.push(server.clone());
        }
        let buffered = (self.buf.len() - used) as u64;
        if buffered > length {
            return Err(bad(format!(
                "{} bytes after a {length}-byte body",
                buffered - length
            ))
            .into());
        }
        self.buf.clear();
        let mut got = buffered;
        if length - got > LARGE_READ as u64 && self.scratch.len() < LARGE_READ {
            self.scratch = vec![0; LARGE_READ].into_boxed_slice();
        }
        while got < length {
            let n = self
                .read(Instant::now() + limit, limit, "waiting for the body")
                .await
                .map_err(|brk| Failure {
                    brk,
                    body_bytes: got,
                })?;
            if n == 0 {
                return Err(Failure {
                    brk: Break::new(
                        BreakKind::Truncated,
                        format!("closed after {got} of {length} body bytes"),
                    ),
                    body_bytes: got,
                });
            }
            got += n as u64;
            if got > length {
                return Err(Failure {
                    brk: bad(format!("{} bytes after a {length}-byte body", got - length)),
                    body_bytes: length,
                });
            }
        }
        self.requests += 1;
        Ok(Answer {
            server,
            latency: sent.elapsed(),
            body_bytes: length,
            closing: !head.keep_alive(),
        })
    }

    /// Waits until `due` or a stop, watching the idle connection: a RST, a FIN or stray
    /// bytes from the server end it at once, at the time they happen.
    pub async fn idle_until(
        &mut self,
        due: Instant,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Wake, Break> {
        // Biased: what already happened on the socket is seen before a due request, so a
        // RST or FIN that arrived during the wait is reported as such, at once.
        tokio::select! {
            biased;
            read = self.stream.read(&mut self.scratch) => match read {
                Ok(0) => Err(Break::new(BreakKind::Closed, "closed by the server while idle")),
                Ok(n) => Err(bad(format!("{n} unrequested bytes while idle"))),
                Err(e) => Err(Break::io(&e)),
            },
            _ = stop.wait_for(|&stopped| stopped) => Ok(Wake::Stop),
            _ = tokio::time::sleep_until(due) => Ok(Wake::Due),
        }
    }

    /// Closes gracefully: FIN, then wait briefly for the server's FIN so neither side is
    /// left with unread data (which would turn the close into a RST).
    pub async fn close(mut self) {
        if self.stream.shutdown().await.is_err() {
            return;
        }
        let _ = timeout(CLOSE_WAIT, async {
            while let Ok(n) = self.stream.read(&mut self.scratch).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }

    /// One read into `scratch`, by `deadline` (`limit` after the wait began).
    async fn read(
        &mut self,
        deadline: Instant,
        limit: Duration,
        doing: &str,
    ) -> Result<usize, Break> {
        match timeout_at(deadline, self.stream.read(&mut self.scratch)).await {
            Err(_) => Err(unanswered(limit, doing)),
            Ok(Err(e)) => Err(Break::io(&e)),
            Ok(Ok(n)) => Ok(n),
        }
    }
}

fn bad(detail: impl Into<String>) -> Break {
    Break::new(BreakKind::BadResponse, detail)
}

fn unanswered(limit: Duration, doing: &str) -> Break {
    Break::new(
        BreakKind::Timeout,
        format!("nothing for {:.1} s {doing}", limit.as_secs_f64()),
    )
}
