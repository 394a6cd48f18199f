//! The daemon's control side, end to end: the HTTP API and metrics on a real socket, the
//! state file across a simulated restart, and `cheetah ctl` as the built binary.

mod api;
mod common;
mod ctl;
mod health;
mod metrics;
mod persist;
