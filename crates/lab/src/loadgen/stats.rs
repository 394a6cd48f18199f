//! What the run has seen so far, shared by every task: counts, latencies, the broken
//! connections, and which long-lived connection is open to which server right now.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::breaks::{Break, BreakKind};

/// The kinds of load, each counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Keepalive,
    Idle,
    Short,
    Download,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::Keepalive, Class::Idle, Class::Short, Class::Download];

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Keepalive => "keepalive",
            Class::Idle => "idle",
            Class::Short => "short",
            Class::Download => "download",
        }
    }

    /// Keep-alive, idle and download connections are long-lived sessions.
    pub fn is_long(self) -> bool {
        self != Class::Short
    }
}

/// A broken connection, with who and when.
#[derive(Debug, Clone)]
pub struct BrokenConn {
    pub class: Class,
    pub kind: BreakKind,
    /// Since the start of the run.
    pub t: Duration,
    /// `None` when the connection never got established (refused, connect timeout).
    pub local_port: Option<u16>,
    /// The `X-Server` values seen on it, first one first.
    pub servers: Vec<String>,
    /// Requests answered on it before it broke.
    pub requests: u64,
    pub detail: String,
}

/// Counts of one class.
#[derive(Debug, Default, Clone)]
pub struct ClassStats {
    pub requests: u64,
    pub body_bytes: u64,
    pub opened: u64,
    /// One per answered request, in µs.
    pub latencies_us: Vec<u64>,
}

/// Everything counted, behind the recorder's lock.
#[derive(Debug, Default)]
pub struct Stats {
    pub classes: [ClassStats; 4],
    /// Connections the server ended with `Connection: close` (not broken).
    pub retired: u64,
    pub requests_by_server: BTreeMap<String, u64>,
    pub broken: Vec<BrokenConn>,
}

impl Stats {
    pub fn class(&self, class: Class) -> &ClassStats {
        &self.classes[class as usize]
    }

    fn class_mut(&mut self, class: Class) -> &mut ClassStats {
        &mut self.classes[class as usize]
    }

    pub fn requests(&self) -> u64 {
        self.classes.iter().map(|c| c.requests).sum()
    }

    pub fn broken_by_kind(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for b in &self.broken {
            *counts.entry(b.kind.as_str().to_owned()).or_default() += 1;
        }
        counts
    }
}

/// The open connection of one long-lived session.
#[derive(Debug, Clone)]
pub struct Live {
    pub class: Class,
    /// Its server, once a response has named it.
    pub server: Option<String>,
}

/// The shared recorder. Locks are held only to bump counters.
pub struct Recorder {
    pub start: Instant,
    stats: Mutex<Stats>,
    /// One slot per long-lived session: its open connection, if any.
    live: Mutex<Vec<Option<Live>>>,
}

impl Recorder {
    pub fn new(long_sessions: usize) -> Recorder {
        Recorder {
            start: Instant::now(),
            stats: Mutex::default(),
            live: Mutex::new(vec![None; long_sessions]),
        }
    }

    pub fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn live(&self) -> MutexGuard<'_, Vec<Option<Live>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn opened(&self, class: Class) {
        self.stats().class_mut(class).opened += 1;
    }

    pub fn answered(&self, class: Class, server: &str, latency: Duration, body_bytes: u64) {
        let mut stats = self.stats();
        let c = stats.class_mut(class);
        c.requests += 1;
        c.body_bytes += body_bytes;
        c.latencies_us
            .push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
        match stats.requests_by_server.get_mut(server) {
            Some(n) => *n += 1,
            None => {
                stats.requests_by_server.insert(server.to_owned(), 1);
            }
        }
    }

    /// Body bytes of a request that did not complete.
    pub fn partial_body(&self, class: Class, body_bytes: u64) {
        self.stats().class_mut(class).body_bytes += body_bytes;
    }

    pub fn retired(&self) {
        self.stats().retired += 1;
    }

    pub fn broken(
        &self,
        class: Class,
        brk: Break,
        local_port: Option<u16>,
        servers: &[String],
        requests: u64,
    ) {
        let record = BrokenConn {
            class,
            kind: brk.kind,
            t: self.start.elapsed(),
            local_port,
            servers: servers.to_vec(),
            requests,
            detail: brk.detail,
        };
        tracing::debug!(?record, "broken connection");
        self.stats().broken.push(record);
    }

    pub fn set_live(&self, slot: usize, live: Option<Live>) {
        self.live()[slot] = live;
    }

    /// Long-lived connections open now.
    pub fn live_count(&self) -> usize {
        self.live().iter().filter(|l| l.is_some()).count()
    }
}
