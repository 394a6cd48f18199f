//! The load-balancing pipeline and the per-worker state it keeps beside the policies.

pub mod fallback;
pub mod rate_limit;
pub mod shared;

pub use shared::LbShared;
