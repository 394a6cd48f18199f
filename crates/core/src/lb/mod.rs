//! The load-balancing pipeline and the per-worker state it keeps beside the policies.

mod client_path;
pub mod closes;
pub mod cookie_stage;
pub mod counters;
pub mod fallback;
mod fast_path;
pub mod handshakes;
mod icmp_path;
pub mod ingress;
pub mod rate_limit;
mod server_path;
mod server_reply;
pub mod shared;
pub mod worker;

pub use counters::{Bundle, Counter, WorkerCounters};
pub use ingress::Ingress;
pub use shared::{LbShared, SharedTables};
pub use worker::{Worker, WorkerConfig};
