//! What survives a daemon restart, and how it is restored.
//!
//! One JSON file, `state.json` in the daemon's state directory, holds:
//!
//! * the control tables ([`ControlState`]): every server with its state (active,
//!   draining, or removed and still quarantined, with the seconds of quarantine left),
//!   servers added at run time, pool membership, policies, metrics and weights;
//! * each server's estimated timestamp clock ([`PersistedMsb`]), so a restarted LB can
//!   restore the TSecr of connections that were open before the restart;
//! * the cookie layout (`cookie_epoch_bits`) the LB ran with;
//! * a fingerprint of the config's LB sections and the wall-clock time of the save.
//!
//! It is written atomically (temporary file, fsync, rename, fsync of the directory) every
//! second by the saver thread (`saver.rs`), after every successful control change, and on
//! shutdown, each time with `fallback.bin` beside it. This module is the file format and
//! the restore rule only: the daemon gathers what is saved ([`SaveContents`]).
//!
//! # Restore rule
//!
//! * **No state file**: the config's tables.
//! * **Config unchanged** since the save (same fingerprint of the parsed LB sections, so
//!   comments and formatting do not count): the saved tables win, so changes made through
//!   the API survive the restart. If they no longer validate, the config's are used, as
//!   below, with a warning.
//! * **Config changed**: the config's tables win, but ids that were removed and are still
//!   quarantined stay quarantined for the time they had left (unless the config itself
//!   defines the id again: the config wins, with a warning).
//! * In every case the quarantine clock kept running while the daemon was down: the
//!   wall-clock time since the save is taken off, and no quarantine is longer than the
//!   config's `quarantine_secs`.
//! * **Clock estimates** are restored in both cases, carried forward by the wall-clock time
//!   since the save, if the file was saved at most 10 minutes ago
//!   ([`MAX_PERSISTED_AGE_MS`](cheetah_core::cookie::msb::MAX_PERSISTED_AGE_MS)); an older
//!   file's are refused and re-learnt from each server's next packet. An id whose address
//!   differs between the file and the restored tables is a different server: its clock is
//!   not restored.
//! * **Connections without a cookie**: the fallback table's flows are saved beside it, in
//!   `fallback.bin` (`fallback_state.rs`), and taken back if the key and layout are the
//!   same and the table is no bigger than the saved one.
//! * **Cookie layout**: a file written with another `cookie_epoch_bits` than the config's
//!   stops the start ([`Persister::restore`]): the connections that LB opened carry cookies
//!   of its layout, which this one would read as other servers. A file of format 1 (before
//!   layouts, the paper's one version bit) is read for its tables only; the connections
//!   open across that upgrade break at their next packet (README, "Upgrading").

use std::collections::BTreeMap;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context};
use cheetah_core::config::{ConfigError, LbConfig};
use cheetah_core::cookie::PersistedMsb;
use cheetah_core::hash::Secret;
use cheetah_core::lb::SharedTables;
use cheetah_core::tables::{ControlPlane, ControlState, SavedServerState, TablesMaker};
use cheetah_core::types::Nanos;
use serde::{Deserialize, Serialize};

use crate::clock::{unix_ms, Clock};
use crate::fallback_state::{self, Restored};
use crate::replace_file::{replace_file, Sync};

pub const STATE_FILE: &str = "state.json";
const FORMAT: u32 = 2;
/// Before cookie layouts: 1 version bit, 15 id bits, MSBs (not TSvals) persisted.
const FORMAT_ONE_VERSION_BIT: u32 = 1;

/// The state file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    pub format: u32,
    /// Wall-clock time of the save, ms since the Unix epoch.
    pub saved_at_unix_ms: u64,
    /// [`config_fingerprint`] of the config the daemon ran with.
    pub config_fingerprint: String,
    /// The cookie layout the daemon ran with (absent in format 1).
    #[serde(default)]
    pub cookie_epoch_bits: Option<u8>,
    pub tables: ControlState,
    pub msb: PersistedMsb,
}

/// What one save writes, gathered from the running LB by the caller.
pub struct SaveContents {
    /// The control tables (`ControlPlane::export`).
    pub tables: ControlState,
    /// Each server's timestamp clock, as of the wall-clock time the save was given.
    pub msb: PersistedMsb,
    /// The cookie layout the LB runs.
    pub cookie_epoch_bits: u8,
    /// The fallback table's flows, in the format of `fallback.bin`
    /// ([`fallback_state::encode`]).
    pub fallback: Vec<u8>,
}

/// A fingerprint of the LB sections of a config: 64-bit FNV-1a of their canonical JSON
/// (fixed field order, weights sorted), so it is stable across builds and ignores
/// comments and formatting.
pub fn config_fingerprint(config: &LbConfig) -> String {
    let canonical = serde_json::to_vec(config).expect("a config always serializes");
    let hash = canonical.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Where the tables of a restored control plane came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TablesFrom {
    /// No state file: the config.
    Config,
    /// The state file (the config is unchanged since it was saved).
    SavedState,
    /// The config, which changed since the save; quarantines were kept.
    ConfigChanged,
    /// The config, because the saved tables did not validate (the reason).
    SavedStateInvalid(String),
}

/// What [`restore`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    pub tables: TablesFrom,
    /// Removed ids quarantined again from the file (config-wins case), with seconds left.
    pub quarantine_kept: Vec<(u16, u64)>,
    /// Quarantined ids the changed config defines again.
    pub quarantine_overridden: Vec<u16>,
    /// How many MSBs were restored, or why none were.
    pub msb: Result<usize, String>,
}

/// Builds the control plane from `config` and, if there is one, the saved state, by the
/// rule in this module's documentation. `now` is the daemon clock, `now_unix_ms` the wall
/// clock. Fails only if the config itself is invalid.
pub fn restore(
    config: &LbConfig,
    secret: &Secret,
    saved: Option<&StateFile>,
    now: Nanos,
    now_unix_ms: u64,
) -> Result<(ControlPlane, RestoreReport), ConfigError> {
    restore_with_tables(config, secret, saved, now, now_unix_ms, &SharedTables::new)
}

/// [`restore`] with the clock and handshake tables `make_tables` makes.
pub fn restore_with_tables(
    config: &LbConfig,
    secret: &Secret,
    saved: Option<&StateFile>,
    now: Nanos,
    now_unix_ms: u64,
    make_tables: TablesMaker,
) -> Result<(ControlPlane, RestoreReport), ConfigError> {
    let Some(saved) = saved else {
        let plane = ControlPlane::new_with_tables(config, secret, make_tables)?;
        let report = RestoreReport {
            tables: TablesFrom::Config,
            quarantine_kept: Vec::new(),
            quarantine_overridden: Vec::new(),
            msb: Err("no state file".into()),
        };
        return Ok((plane, report));
    };
    // The quarantine went on while the daemon was down (a clock that went back counts as
    // no time, which keeps ids retired longer, never shorter).
    let down_secs = now_unix_ms.saturating_sub(saved.saved_at_unix_ms) / 1000;
    let mut saved_tables = saved.tables.clone();
    for server in &mut saved_tables.servers {
        if let Some(left) = &mut server.quarantine_left_secs {
            *left = left.saturating_sub(down_secs);
        }
    }

    let mut report = RestoreReport {
        tables: TablesFrom::ConfigChanged,
        quarantine_kept: Vec::new(),
        quarantine_overridden: Vec::new(),
        msb: Ok(0),
    };
    let mut plane = None;
    if saved.config_fingerprint == config_fingerprint(config) {
        match ControlPlane::restore_with_tables(config, secret, &saved_tables, now, make_tables) {
            Ok(restored) => {
                report.tables = TablesFrom::SavedState;
                plane = Some(restored);
            }
            Err(e) => report.tables = TablesFrom::SavedStateInvalid(e.to_string()),
        }
    }
    let plane = match plane {
        Some(plane) => plane,
        None => {
            let mut plane = ControlPlane::new_with_tables(config, secret, make_tables)?;
            // Removed servers' records are checked leniently (dip and MAC syntax only);
            // one that does not even parse cannot be quarantined again.
            match plane.restore_quarantine(&saved_tables, now) {
                Ok(q) => {
                    report.quarantine_kept = q.kept;
                    report.quarantine_overridden = q.overridden;
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "the state file's quarantined servers could not be restored"
                ),
            }
            plane
        }
    };

    // MSBs only for ids that name the same server (same address) as when they were saved.
    let saved_dips: BTreeMap<u16, IpAddr> = saved
        .tables
        .servers
        .iter()
        .filter(|s| s.state != SavedServerState::Removed)
        .map(|s| (s.id, s.dip))
        .collect();
    let current_dips: BTreeMap<u16, IpAddr> = plane
        .servers(now)
        .into_iter()
        .map(|s| (s.id.0, IpAddr::V4(s.dip)))
        .collect();
    let msb = PersistedMsb {
        saved_at_unix_ms: saved.msb.saved_at_unix_ms,
        servers: saved
            .msb
            .servers
            .iter()
            .copied()
            .filter(|(id, _)| {
                saved_dips.contains_key(id) && saved_dips.get(id) == current_dips.get(id)
            })
            .collect(),
    };
    report.msb = if saved.cookie_epoch_bits == Some(config.cookie_epoch_bits) {
        plane
            .shared()
            .msb
            .load_persisted(&msb, now, now_unix_ms)
            .map_err(|e| e.to_string())
    } else {
        Err("saved under another cookie layout".into())
    };
    Ok((plane, report))
}

/// Reads and writes the state file of one daemon.
pub struct Persister {
    dir: PathBuf,
    config_fingerprint: String,
    /// One save at a time, and exports in the order they are written.
    writing: Mutex<()>,
}

impl Persister {
    /// Creates the state directory if needed.
    pub fn new(dir: impl Into<PathBuf>, config: &LbConfig) -> anyhow::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        Ok(Persister {
            dir,
            config_fingerprint: config_fingerprint(config),
            writing: Mutex::new(()),
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The saved state, `None` if there is no file.
    pub fn load(&self) -> anyhow::Result<Option<StateFile>> {
        let path = self.path();
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let mut file: StateFile = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a cheetah state file", path.display()))?;
        match file.format {
            FORMAT if file.cookie_epoch_bits.is_some() => {}
            FORMAT_ONE_VERSION_BIT if file.cookie_epoch_bits.is_none() => {
                // Its MSBs are not TSvals and its cookies are not of any layout: only the
                // tables are of use.
                file.msb.servers.clear();
            }
            _ => bail!(
                "{}: format {} is not one this build reads ({FORMAT_ONE_VERSION_BIT} or {FORMAT})",
                path.display(),
                file.format
            ),
        }
        Ok(Some(file))
    }

    /// Loads the state file and builds the control plane from it and `config` (see the
    /// module documentation), logging what was restored. An unreadable state file is
    /// logged and ignored: the daemon starts from the config.
    pub fn restore(
        &self,
        config: &LbConfig,
        secret: &Secret,
        clock: &Clock,
    ) -> anyhow::Result<ControlPlane> {
        self.restore_with_tables(config, secret, clock, &SharedTables::new)
    }

    /// [`restore`](Persister::restore) with the clock and handshake tables `tables` makes
    /// (the daemon's are over the XDP program's words).
    pub fn restore_with_tables(
        &self,
        config: &LbConfig,
        secret: &Secret,
        clock: &Clock,
        tables: TablesMaker,
    ) -> anyhow::Result<ControlPlane> {
        let saved = self.load().unwrap_or_else(|e| {
            tracing::warn!(error = %format!("{e:#}"), "ignoring the state file: starting from the config");
            None
        });
        if let Some(saved) = &saved {
            check_layout(
                &self.path(),
                saved.cookie_epoch_bits,
                config.cookie_epoch_bits,
            )?;
        }
        let (plane, report) = restore_with_tables(
            config,
            secret,
            saved.as_ref(),
            clock.now(),
            unix_ms(),
            tables,
        )
        .map_err(anyhow::Error::msg)?;
        log_report(&self.path(), &report);
        match fallback_state::restore(&self.dir, plane.shared(), clock.now(), unix_ms()) {
            Restored::NoFile => {}
            Restored::Flows(flows) => tracing::info!(
                flows,
                "connections without a cookie restored into the fallback table"
            ),
            Restored::Kept(flows) => tracing::info!(
                flows,
                "connections without a cookie kept in the pinned fallback table"
            ),
            Restored::Refused(why) => tracing::warn!(
                reason = %why,
                "connections without a cookie not restored: Maglev places them"
            ),
        }
        Ok(plane)
    }

    /// Saves what `take` gathers: `state.json` atomically and durably, `fallback.bin`
    /// beside it. `take` is given the wall-clock time of the save and runs while this
    /// persister writes nothing else, so concurrent saves (the saver thread, the API after a
    /// change) write in the order their contents were taken: an older state never replaces
    /// a newer one.
    pub fn save(&self, take: impl FnOnce(u64) -> SaveContents) -> anyhow::Result<()> {
        let _one_at_a_time = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let now_unix_ms = unix_ms();
        let contents = take(now_unix_ms);
        self.write(&StateFile {
            format: FORMAT,
            saved_at_unix_ms: now_unix_ms,
            config_fingerprint: self.config_fingerprint.clone(),
            cookie_epoch_bits: Some(contents.cookie_epoch_bits),
            tables: contents.tables,
            msb: contents.msb,
        })?;
        fallback_state::save(&self.dir, &contents.fallback)
    }

    /// Writes `file` atomically: a reader (or a crash) sees the old file or the new one.
    pub fn write(&self, file: &StateFile) -> anyhow::Result<()> {
        let json = serde_json::to_vec_pretty(file)?;
        replace_file(&self.dir, STATE_FILE, &json, Sync::Durable)
    }
}

/// Stops a start whose config asks for another cookie layout than the one the state file
/// was written with: that LB's connections carry cookies this one would misread.
pub fn check_layout(path: &Path, saved: Option<u8>, configured: u8) -> anyhow::Result<()> {
    match saved {
        Some(saved) if saved != configured => bail!(
            "cookie_epoch_bits = {configured}, but {} was written by this LB running cookie_epoch_bits = {saved}: \
             the connections it opened carry cookies of that layout, and this one would send them to other servers. \
             Keep cookie_epoch_bits = {saved}; or, to change the layout (every open connection through this VIP breaks), \
             stop every instance sharing the key, remove their state files, and start them all with the new value",
            path.display()
        ),
        Some(_) => Ok(()),
        None => {
            tracing::warn!(
                path = %path.display(),
                cookie_epoch_bits = configured,
                "state file from before cookie layouts (one version bit): its tables are kept, its \
                 timestamp MSBs are not, and connections opened before the upgrade break at their next packet"
            );
            Ok(())
        }
    }
}

fn log_report(path: &Path, report: &RestoreReport) {
    let path = path.display();
    match &report.tables {
        TablesFrom::Config => tracing::info!(%path, "no state file: tables from the config"),
        TablesFrom::SavedState => {
            tracing::info!(%path, "config unchanged since the last save: tables from the state file")
        }
        TablesFrom::ConfigChanged => tracing::info!(
            %path,
            "config changed since the last save: tables from the config, quarantines kept"
        ),
        TablesFrom::SavedStateInvalid(why) => tracing::warn!(
            %path,
            error = %why,
            "saved tables are not valid any more: tables from the config, quarantines kept"
        ),
    }
    for (id, left) in &report.quarantine_kept {
        tracing::info!(id, left_secs = left, "server id still quarantined");
    }
    for id in &report.quarantine_overridden {
        tracing::warn!(
            id,
            "server id was quarantined but the config defines it again: the config wins"
        );
    }
    match &report.msb {
        Ok(n) => tracing::info!(servers = n, "server timestamp clocks restored"),
        Err(why) => tracing::info!(reason = %why, "server timestamp clocks not restored"),
    }
}
