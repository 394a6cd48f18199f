//! The cheetah load balancer as it runs: `cheetah run` (config, the AF_XDP data path in
//! [`dataplane`], the control side: shared state, the HTTP/JSON API, Prometheus metrics and
//! the state file) and `cheetah ctl`. The data path plugs into the control side through
//! [`state::DaemonState`].
//!
//! Start-up, in order:
//!
//! ```ignore
//! let clock = Clock::start();
//! let persister = Persister::new(state_dir, &config.lb)?;
//! let plane = persister.restore(&config.lb, &secret, &clock)?; // see persist.rs
//! let state = Arc::new(DaemonState::new(plane, clock, Some(persister)));
//! // data path: per worker, Worker::new(Arc::clone(&state.shared), ...), then
//! //   let io = state.register_worker(index, queue, Arc::clone(worker.counters()));
//! //   and state.set_interfaces(...) once attached; use state.now() as `now`.
//! let api = api::spawn(Arc::clone(&state), listen)?;
//! let saver = saver::spawn(Arc::clone(&state), Duration::from_secs(1))?;
//! let prober = health::spawn(Arc::clone(&state))?; // after the XDP program is attached
//! // ... on shutdown:
//! prober.shutdown();
//! api.shutdown();
//! saver.shutdown(); // saves a last time
//! ```

pub mod api;
pub mod clock;
pub mod config;
pub mod ctl;
pub mod dataplane;
mod entropy;
pub mod fallback_state;
pub mod health;
pub mod metrics;
pub mod persist;
pub mod published;
mod replace_file;
pub mod run;
pub mod saver;
mod service;
pub mod state;

pub use clock::Clock;
pub use dataplane::IoCounters;
pub use state::{DaemonState, InterfaceStatus, WorkerStats};
