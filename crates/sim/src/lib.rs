//! `cheetah sim`: a discrete-event simulator of one VIP behind cheetah and behind the load
//! balancers the NSDI'20 paper compares it with (section 2, figure 9).
//!
//! Every cheetah policy simulated is the core's own code (`cheetah_core::policy`), called
//! with a load view that holds the simulated active connections, so the numbers describe
//! the load balancer cheetah ships. See `docs/simulation.md` for the models, their sources
//! and the results beside the paper's.

pub mod cli;
pub mod conns;
pub mod engine;
pub mod lbs;
pub mod metrics;
pub mod plot;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod workload;

pub use engine::{run, RunOptions, RunResult};
pub use lbs::LbSpec;
pub use scenario::{Scenario, Study};
