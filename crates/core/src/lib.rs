//! Sans-IO core of the cheetah load balancer.
//!
//! Packets go in, verdicts come out. Nothing here opens a socket, spawns a thread or reads a
//! clock: time (`Nanos`) and randomness (seeds) are passed in, so a pcap replay, the
//! simulator, the fuzzer and the AF_XDP workers all drive exactly the same code and a run
//! replays bit for bit.

pub mod config;
pub mod cookie;
pub mod hash;
pub mod lb;
pub mod names;
pub mod policy;
pub mod tables;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod types;
pub mod verdict;
pub mod wire;
pub mod words;

pub use types::{Nanos, ServerId};
pub use verdict::{DropReason, Verdict};
