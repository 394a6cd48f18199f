//! Health checks: every instance probes every server of every VIP by itself (a TCP SYN with
//! the timestamp option, or an HTTP GET with `http_path`), takes a server that fails `fall`
//! probes in a row out of that VIP's pool and puts it back after `rise` successes; the
//! SYN-ACKs teach this instance every server's clock, which readiness waits for.
//!
//! - `state.rs`: one (VIP, server)'s state machine and the probes' outcomes;
//! - `syn_probe.rs`: the SYN probe on a raw socket;
//! - `http_check.rs`: the HTTP check;
//! - `prober.rs`: the thread that runs them and applies the decisions;
//! - `book.rs`: the decisions with their reasons, for the API and metrics;
//! - `readiness.rs`: whether this instance is ready for traffic.

pub mod book;
pub mod http_check;
pub mod prober;
pub mod readiness;
pub mod state;
pub mod syn_probe;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;

pub use book::{HealthBook, HealthStatus};
pub use readiness::{readiness, Readiness};

use crate::service::ServiceThread;
use crate::state::DaemonState;

/// The running prober; stopped and joined when dropped or shut down.
pub struct ProberHandle {
    service: ServiceThread,
}

impl ProberHandle {
    pub fn shutdown(self) {
        self.service.shutdown();
    }
}

/// Starts probing on a thread of its own (needs CAP_NET_RAW for the raw socket).
pub fn spawn(state: Arc<DaemonState>) -> anyhow::Result<ProberHandle> {
    let prober = prober::Prober::new(state)
        .context("cannot open the health probes' raw socket (needs CAP_NET_RAW)")?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("cheetah-health".into())
        .spawn(move || prober.run(&flag))
        .context("cannot start the health prober's thread")?;
    Ok(ProberHandle {
        service: ServiceThread::new(move || stop.store(true, Ordering::Relaxed), thread),
    })
}
