//! Compiles the XDP program of `cheetah run` (it steers the LB's packets to the AF_XDP
//! sockets) from `bpf/`.

include!("../../bpf/compile.rs");

fn main() {
    compile_bpf_program("xdp_steer");
}
