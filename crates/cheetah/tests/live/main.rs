//! The live end-to-end tests: `cheetah run` on the veths of `cheetah testbed` (AF_XDP,
//! real nginx servers, real Linux TCP clients in network namespaces). They need root; each
//! module is one subject, and `cargo test -p cheetah --test live smoke::` runs one.
//!
//! One binary, so one lock ([`support::live_scenario`]) keeps every scenario to itself
//! while the tests that need no root run beside them; each scenario's testbed has a prefix
//! of its own.

mod abuse;
mod applied;
mod churn;
mod clock_moves;
mod closes;
mod forwarding;
mod health;
mod idle;
mod maglev;
mod multi;
mod path_mtu;
mod pinned;
mod readd;
mod schedules;
mod server_clocks;
mod smoke;
mod support;
mod syn_retry;
mod timestamps;
