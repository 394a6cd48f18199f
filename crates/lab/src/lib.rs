//! The cheetah lab: everything that exercises or measures the load balancer rather than
//! being it. The namespace testbed and its churn scenarios, the HTTP load generator, the
//! pipeline benchmarks, pcap replay, crafted frames for abuse tests, and the metrics
//! scraper they share. The daemon must never depend on this crate.

pub mod bench;
pub mod churn;
pub mod crafted;
pub mod loadgen;
pub mod replay;
pub mod scrape;
pub mod testbed;
pub mod testbed_cli;
