//! The per-packet verdict log: one TSV line per input record, so an operator can find any
//! packet of the capture (by its Wireshark frame number) and see what the LB decided.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cheetah_core::{ServerId, Verdict};

use super::capture::RecordMeta;

/// The header line; the columns are documented in `docs/replay.md` and `--help`.
pub const HEADER: &str = "index\ttime_ns\tworker\tverdict\tserver\treason\n";

/// A verdict without its payload, for the log's `verdict` column and the summary's tallies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerdictKind {
    ToServer,
    ToClient,
    ToAllServers,
    Pass,
    Drop,
}

impl VerdictKind {
    pub const ALL: [VerdictKind; 5] = [
        VerdictKind::ToServer,
        VerdictKind::ToClient,
        VerdictKind::ToAllServers,
        VerdictKind::Pass,
        VerdictKind::Drop,
    ];

    pub fn of(verdict: &Verdict) -> Self {
        match verdict {
            Verdict::ToServer(_) => VerdictKind::ToServer,
            Verdict::ToClient => VerdictKind::ToClient,
            Verdict::ToAllServers { .. } => VerdictKind::ToAllServers,
            Verdict::Pass => VerdictKind::Pass,
            Verdict::Drop(_) => VerdictKind::Drop,
        }
    }

    /// Stable snake_case name, as in the log and the counters.
    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::ToServer => "to_server",
            VerdictKind::ToClient => "to_client",
            VerdictKind::ToAllServers => "to_all_servers",
            VerdictKind::Pass => "pass",
            VerdictKind::Drop => "drop",
        }
    }
}

pub struct VerdictLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl VerdictLog {
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path)
            .with_context(|| format!("cannot create verdict log {}", path.display()))?;
        let mut log = VerdictLog {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        };
        log.out
            .write_all(HEADER.as_bytes())
            .with_context(|| format!("cannot write verdict log {}", path.display()))?;
        Ok(log)
    }

    /// One line. `targets` are the servers a `to_all_servers` packet was copied to; they fill
    /// the `server` column comma-separated, so the log says where every copy went.
    pub fn write(
        &mut self,
        meta: &RecordMeta,
        worker: usize,
        verdict: &Verdict,
        targets: &[ServerId],
    ) -> Result<()> {
        self.write_line(meta, worker, verdict, targets)
            .with_context(|| format!("cannot write verdict log {}", self.path.display()))
    }

    fn write_line(
        &mut self,
        meta: &RecordMeta,
        worker: usize,
        verdict: &Verdict,
        targets: &[ServerId],
    ) -> std::io::Result<()> {
        let out = &mut self.out;
        write!(
            out,
            "{}\t{}\t{worker}\t{}\t",
            meta.number,
            meta.ts_ns,
            VerdictKind::of(verdict).name()
        )?;
        match verdict {
            Verdict::ToServer(server) => write!(out, "{server}")?,
            Verdict::ToAllServers { .. } if !targets.is_empty() => {
                for (i, server) in targets.iter().enumerate() {
                    if i > 0 {
                        out.write_all(b",")?;
                    }
                    write!(out, "{server}")?;
                }
            }
            _ => out.write_all(b"-")?,
        }
        match verdict {
            Verdict::Drop(reason) => writeln!(out, "\t{}", reason.name()),
            _ => out.write_all(b"\t-\n"),
        }
    }

    /// Flushes the file, so a full disk is an error rather than a silently short log.
    pub fn finish(self) -> Result<()> {
        let path = self.path;
        self.out
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|file| file.sync_all())
            .with_context(|| format!("cannot write verdict log {}", path.display()))
    }
}
