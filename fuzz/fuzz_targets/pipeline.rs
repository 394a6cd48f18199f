//! Whole-pipeline fuzz target: any bytes become a config, control actions and packets fed
//! through one or two workers; see `harness.rs` for the input format and the invariants.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| harness::run(data));
