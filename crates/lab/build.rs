//! Compiles the testbed servers' timestamp clock (a tc program) from `bpf/`.

include!("../../bpf/compile.rs");

fn main() {
    compile_bpf_program("server_clock");
}
