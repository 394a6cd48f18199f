//! The one replace-by-rename writer of the state directory (`state.json`, `fallback.bin`):
//! a reader, or a crash of the process, sees the old file or the new one, never a mix.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Whether [`replace_file`] waits for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// fsync the file before the rename and the directory after it: the rename survives a
    /// crash of the host.
    Durable,
    /// No fsync: a crash of the host may leave the previous file, none, or a short one.
    NotSynced,
}

/// Replaces `dir/name` by `bytes` through a temporary file and a rename, so a reader (or a
/// crash of the process) sees the old file or the new one.
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8], sync: Sync) -> anyhow::Result<()> {
    let path = dir.join(name);
    let temp = dir.join(format!(".{name}.tmp"));
    let result = (|| -> std::io::Result<()> {
        let mut out = File::create(&temp)?;
        out.write_all(bytes)?;
        if sync == Sync::Durable {
            out.sync_all()?;
        }
        fs::rename(&temp, &path)?;
        if sync == Sync::Durable {
            // The rename itself is durable once the directory is.
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    result.with_context(|| format!("cannot write {}", path.display()))
}
