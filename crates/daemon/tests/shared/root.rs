//! Whether the test runs as root: the tests that load BPF programs or make network
//! namespaces skip, loudly, when it does not (included by path, `#[path]`).

pub fn is_root() -> bool {
    // SAFETY: no arguments, no memory.
    unsafe { libc::geteuid() == 0 }
}
