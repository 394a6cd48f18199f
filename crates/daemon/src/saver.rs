//! The thread that saves the daemon's state (`persist.rs`) every second, and once more
//! when it is stopped.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::service::ServiceThread;
use crate::state::DaemonState;

/// The thread that saves the state file every `every`, and once more when stopped.
pub struct SaverHandle {
    service: ServiceThread,
}

/// Starts saving `daemon`'s state (it must have a persister) every `every`.
pub fn spawn(daemon: Arc<DaemonState>, every: Duration) -> anyhow::Result<SaverHandle> {
    if daemon.persister().is_none() {
        bail!("the daemon has no state directory to save to");
    }
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("cheetah-persist".into())
        .spawn(move || loop {
            let last = match stopped.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => false,
                Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
            };
            daemon.persist();
            if last {
                break;
            }
        })
        .context("cannot start the persister thread")?;
    Ok(SaverHandle {
        service: ServiceThread::new(
            move || {
                let _ = stop.send(());
            },
            thread,
        ),
    })
}

impl SaverHandle {
    /// Stops the thread after a last save.
    pub fn shutdown(self) {
        self.service.shutdown();
    }
}
