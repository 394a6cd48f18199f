//! A long-lived session: one TCP connection reused for request after request (keep-alive,
//! idle and download classes). When the connection breaks, the break is recorded once and
//! (with `--reconnect`) a new connection takes its place.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::breaks::Break;
use super::conn::{connect, Conn, Wake};
use super::http;
use super::stats::{Class, Live, Recorder};
use super::Settings;

/// Pause after a broken connection or a failed connect before the next connect, so a
/// server that refuses or resets everything is not hammered in a tight loop.
const RECONNECT_DELAY: Duration = Duration::from_millis(200);

/// One session's part in the workload.
pub struct Plan {
    pub class: Class,
    /// Its slot in the recorder's table of live connections.
    pub slot: usize,
    /// When it starts, after the beginning of the run (starts are staggered).
    pub start_delay: Duration,
    /// From one request to the next (from start to start); zero: back to back.
    pub gap: Duration,
    pub path: String,
}

/// Runs `plan` until `stop`, then closes its connection gracefully.
pub async fn run(
    plan: Plan,
    settings: Arc<Settings>,
    rec: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) {
    let request = http::request(&settings.host, &plan.path);
    if pause(plan.start_delay, &mut stop).await {
        return;
    }
    let mut session = Session {
        plan: &plan,
        rec: &rec,
        conn: None,
    };
    let mut next = Instant::now();
    loop {
        if *stop.borrow() {
            break;
        }
        if session.conn.is_none() {
            match connect(settings.target, settings.request_timeout).await {
                Ok(conn) => session.opened(conn),
                Err(brk) => {
                    rec.broken(plan.class, brk, None, &[], 0);
                    if !settings.reconnect || pause(RECONNECT_DELAY, &mut stop).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let conn = session.conn.as_mut().expect("connected above");
        let result = match conn.idle_until(next, &mut stop).await {
            Ok(Wake::Stop) => break,
            Ok(Wake::Due) => {
                next = (next + plan.gap).max(Instant::now());
                match conn.exchange(&request, settings.request_timeout).await {
                    Ok(answer) => {
                        rec.answered(
                            plan.class,
                            &answer.server,
                            answer.latency,
                            answer.body_bytes,
                        );
                        if conn.requests == 1 {
                            session.named(&answer.server);
                        }
                        if answer.closing {
                            rec.retired();
                            session.closed().await;
                        }
                        Ok(())
                    }
                    Err(failure) => {
                        rec.partial_body(plan.class, failure.body_bytes);
                        Err(failure.brk)
                    }
                }
            }
            Err(brk) => Err(brk),
        };
        if let Err(brk) = result {
            session.broke(brk);
            if !settings.reconnect || pause(RECONNECT_DELAY, &mut stop).await {
                break;
            }
        }
    }
    if let Some(conn) = session.conn.take() {
        conn.close().await;
    }
}

/// The session's current connection and its entry in the live table.
struct Session<'a> {
    plan: &'a Plan,
    rec: &'a Recorder,
    conn: Option<Conn>,
}

impl Session<'_> {
    fn opened(&mut self, conn: Conn) {
        self.rec.opened(self.plan.class);
        self.set_live(None);
        self.conn = Some(conn);
    }

    /// The first response named the connection's server.
    fn named(&self, server: &str) {
        self.set_live(Some(server.to_owned()));
    }

    /// Records the break and drops the connection.
    fn broke(&mut self, brk: Break) {
        if let Some(conn) = self.conn.take() {
            self.rec.broken(
                self.plan.class,
                brk,
                Some(conn.local_port),
                &conn.servers,
                conn.requests,
            );
        }
        self.rec.set_live(self.plan.slot, None);
    }

    /// The server ended the connection properly: close our side too.
    async fn closed(&mut self) {
        self.rec.set_live(self.plan.slot, None);
        if let Some(conn) = self.conn.take() {
            conn.close().await;
        }
    }

    fn set_live(&self, server: Option<String>) {
        let live = Live {
            class: self.plan.class,
            server,
        };
        self.rec.set_live(self.plan.slot, Some(live));
    }
}

/// Sleeps for `duration` unless stopped first; true if stopped.
pub async fn pause(duration: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if duration.is_zero() {
        return *stop.borrow();
    }
    let stopped = tokio::select! {
        _ = tokio::time::sleep(duration) => false,
        _ = stop.wait_for(|&stopped| stopped) => true,
    };
    stopped || *stop.borrow()
}
