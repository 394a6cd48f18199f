//! Compiles the testbed servers' timestamp clock (a tc program) and the XDP bench wrapper
//! around the LB's program (`cheetah bench --xdp`), and the live bench's reflector, sender
//! and sink (`cheetah bench --xdp-live`) from `bpf/`.

include!("../../bpf/compile.rs");

fn main() {
    compile_bpf_program("server_clock");
    compile_bpf_program("xdp_bench");
    compile_bpf_program("xdp_reflect");
    compile_bpf_program("xdp_traffic");
}
