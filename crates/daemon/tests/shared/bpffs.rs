//! A BPF filesystem of the test's own (included by path, `#[path]`): mounted on a fresh
//! temporary directory, so that no two tests, in this binary or another, ever share a pin
//! directory, and unmounted when the guard drops, a failing test's too (the pinned maps
//! go with it).

use std::ffi::CString;
use std::path::PathBuf;

pub struct TempBpffs {
    dir: tempfile::TempDir,
}

impl TempBpffs {
    pub fn mount() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cheetah-bpffs-")
            .tempdir()
            .expect("a temporary directory");
        let target = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let bpf = CString::new("bpf").unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                bpf.as_ptr(),
                target.as_ptr(),
                bpf.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "mount bpffs: {}", std::io::Error::last_os_error());
        TempBpffs { dir }
    }

    /// A directory on this filesystem (not created).
    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for TempBpffs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; a lazy unmount of our own mount.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}
