//! The cheetah daemon's control side and `cheetah ctl`, as a library so that integration
//! tests can run the API in-process beside the built binary.

pub mod ctl;
pub mod daemon;
