//! Hashing the connection id.
//!
//! [`siphash`] is the keyed PRF behind cookies and hash-based policies; [`toeplitz`] is the
//! NIC-style RSS hash, kept only so benchmarks can show what the PRF costs beside it.

pub mod siphash;
pub mod toeplitz;

pub use siphash::{FlowHasher, FlowKey, Secret, VipHashPrefix};
