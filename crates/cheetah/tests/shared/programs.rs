//! Running the built `cheetah` and other programs, here or inside a network namespace.
//!
//! Shared by test binaries that each use all of it, included by path (`#[path]`): a
//! `tests/` subdirectory is no crate of its own, and a module a binary used only in part
//! would need a dead-code allowance.

use std::process::{Command, Output};

pub fn cheetah_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cheetah")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn cheetah(args: &[&str]) -> Output {
    Command::new(cheetah_bin())
        .args(args)
        .output()
        .expect("cannot run the cheetah binary")
}

pub fn cheetah_ok(args: &[&str]) -> String {
    let out = cheetah(args);
    assert!(
        out.status.success(),
        "`cheetah {}` failed: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a program inside a namespace; returns its output whether or not it succeeded.
pub fn in_netns(namespace: &str, program: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", namespace, program])
        .args(args)
        .output()
        .expect("cannot run ip netns exec")
}

pub fn in_netns_ok(namespace: &str, program: &str, args: &[&str]) -> String {
    let out = in_netns(namespace, program, args);
    assert!(
        out.status.success(),
        "`{program} {}` in {namespace} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
