// Shared by the build scripts of the crates that carry a BPF program (`include!`d, since a
// build script cannot depend on its own workspace's crates without a crate of its own).
// A program is compiled with clang into OUT_DIR, so the binary carries it (no files to
// install next to the binary, and a program always matches the userspace that loads it).
// What a program shares with its userspace lives in `bpf/include/` (cheetah_shared.h).

/// Compiles `bpf/<name>.c` into `$OUT_DIR/<name>.o`.
fn compile_bpf_program(name: &str) {
    use std::env;
    use std::path::PathBuf;
    use std::process::Command;

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    let bpf = manifest.join("../../bpf");
    let source = bpf.join(format!("{name}.c"));
    let out = out_dir.join(format!("{name}.o"));
    println!("cargo:rerun-if-changed={}", bpf.display());
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{arch_include}"))
        .arg(format!("-I{}", bpf.join("include").display()))
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
