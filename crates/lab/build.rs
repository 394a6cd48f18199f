//! Compiles the testbed servers' timestamp clock (a tc program) and the XDP bench wrapper
//! around the LB's program (`cheetah bench --xdp`) from `bpf/`.

include!("../../bpf/compile.rs");

fn main() {
    compile_bpf_program("server_clock");
    compile_bpf_program("xdp_bench");
}
