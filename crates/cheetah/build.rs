//! Compiles the BPF programs in `bpf/` with clang so the binary carries them (no files to
//! install next to the binary, and a program always matches the userspace that loads it):
//! the XDP steering program of `cheetah run`, and the testbed servers' timestamp clock.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 2] = ["xdp_lb", "server_clock"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    for name in PROGRAMS {
        let source = manifest.join(format!("../../bpf/{name}.c"));
        let out = out_dir.join(format!("{name}.o"));
        println!("cargo:rerun-if-changed={}", source.display());
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-I{arch_include}"))
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&out)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run {clang} to build the BPF programs ({e}); run scripts/setup.sh")
            });
        assert!(
            status.success(),
            "{clang} failed to build {}; run scripts/setup.sh (needs clang, libbpf-dev)",
            source.display()
        );
    }
}
