//! Whole-pipeline fuzz target: any bytes become a config, control actions and packets fed
//! through one or two workers; see `harness/` for the input format (`input.rs`) and the
//! invariants (`checks.rs`).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/mod.rs"]
mod harness;

fuzz_target!(|data: &[u8]| harness::run(data));
