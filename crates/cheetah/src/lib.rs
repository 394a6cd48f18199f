//! The cheetah daemon (`cheetah run`: the AF_XDP data path, the control API, metrics and
//! the state file) and `cheetah ctl`, as a library so that integration tests can run parts
//! of it in-process beside the built binary.

pub mod config;
pub mod crafted;
pub mod ctl;
pub mod daemon;
pub mod dataplane;
pub mod run;
