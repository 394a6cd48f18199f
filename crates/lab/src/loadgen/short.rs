//! Short connections at a steady rate: connect, one request, close. A connection that
//! fails in any way (refused, reset, timeout, bad answer) is recorded as broken.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::conn::connect;
use super::http;
use super::stats::{Class, Recorder};
use super::Settings;

/// Opens `rate` connections per second until `stop`, then waits for those in flight.
pub async fn run(
    rate: f64,
    path: String,
    settings: Arc<Settings>,
    rec: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) {
    if rate <= 0.0 {
        return;
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let request: Arc<[u8]> = http::request(&settings.host, &path).into();
    let mut tasks = JoinSet::new();
    let mut next = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.wait_for(|&stopped| stopped) => break,
        }
        tasks.spawn(one(request.clone(), settings.clone(), rec.clone()));
        next += period;
        // After a stall (a busy machine), go on at the rate rather than catch up in a burst.
        let now = Instant::now();
        if next + period < now {
            next = now;
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

async fn one(request: Arc<[u8]>, settings: Arc<Settings>, rec: Arc<Recorder>) {
    let mut conn = match connect(settings.target, settings.request_timeout).await {
        Ok(conn) => conn,
        Err(brk) => {
            rec.broken(Class::Short, brk, None, &[], 0);
            return;
        }
    };
    rec.opened(Class::Short);
    match conn.exchange(&request, settings.request_timeout).await {
        Ok(answer) => {
            rec.answered(
                Class::Short,
                &answer.server,
                answer.latency,
                answer.body_bytes,
            );
            conn.close().await;
        }
        Err(failure) => {
            rec.partial_body(Class::Short, failure.body_bytes);
            rec.broken(
                Class::Short,
                failure.brk,
                Some(conn.local_port),
                &conn.servers,
                conn.requests,
            );
        }
    }
}
