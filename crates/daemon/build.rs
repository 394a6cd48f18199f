//! Compiles the XDP program of `cheetah run` (it forwards the LB's packets in the kernel or
//! steers them to the AF_XDP sockets) from `bpf/`.

include!("../../bpf/compile.rs");

fn main() {
    compile_bpf_program("xdp_lb");
}
