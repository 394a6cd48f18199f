//! Compiles the XDP program in `bpf/` with clang so the binary carries it (no files to
//! install next to the binary, and the program always matches the userspace that loads it).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let source = manifest.join("../../bpf/xdp_lb.c");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("xdp_lb.o");
    println!("cargo:rerun-if-changed={}", source.display());
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{arch_include}"))
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run {clang} to build the XDP program ({e}); run scripts/setup.sh")
        });
    assert!(
        status.success(),
        "{clang} failed to build {}; run scripts/setup.sh (needs clang, libbpf-dev)",
        source.display()
    );
}
