//! Pins the XDP program's maps under a BPF filesystem (`[daemon] bpf_pin_dir`), so that
//! what the kernel keeps (clocks, handshakes, closes, the fallback table, counters, the
//! published tables) outlives the process: after `kill -9`, a restart or an upgrade, the
//! next `cheetah run` loads its program over the same maps and no connection notices.
//!
//! Which maps: every map of the object by rule, not by a list of names, so a map added
//! later is pinned too; except those that must be fresh per process (maps of file
//! descriptors, like the AF_XDP socket map `xsks`; caches, named `*_cache`, whose entries
//! are tagged with a `publish_seq` that a fresh `lb_config` would count again from 0, so
//! a kept cache could take an old answer for a new one; scratch space, named `*_scratch`,
//! which holds one packet's work and nothing after it) and libbpf's internal `.rodata`,
//! `.data` and `.bss` maps. A pinned map is reused only when its definition (type, key and
//! value sizes, entries, flags) is the new program's and it was pinned under the same
//! [`PIN_LAYOUT`] and the same key and cookie layout (the secret's fingerprint: under
//! another key every cookie, flow hash and fallback tag the maps hold means something
//! else); otherwise it is replaced, and the log says which map and why.
//!
//! On the filesystem: `<bpf_pin_dir>/layout-<PIN_LAYOUT>-key-<fingerprint>/<map name>`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use libbpf_rs::libbpf_sys;
use libbpf_rs::{AsRawLibbpf, MapHandle, MapInfo, MapType, OpenMapMut, OpenObject};

use super::xdp_layout::PIN_LAYOUT;

/// Where the default pin directories live: a BPF filesystem outside `/sys`, because
/// `ip netns exec` mounts a sysfs of its own over `/sys` (hiding `/sys/fs/bpf`), and an
/// LB instance in a namespace must find its pins there after a restart too.
pub const DEFAULT_ROOT: &str = "/run/cheetah/bpf";

/// A validated pin directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinDir {
    path: PathBuf,
    /// The secret's fingerprint (key and cookie layout) the maps are pinned under.
    key: String,
}

/// What [`prepare`] found for each pinned map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PinReport {
    /// By map name: kept (reused with its contents), or why it starts fresh.
    pub maps: BTreeMap<String, Pinned>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pinned {
    /// An earlier run's map, reused with what it holds.
    Kept,
    /// No pinned map of that name: a fresh one is pinned.
    New,
    /// A pinned map was there but is not this program's: it was replaced by a fresh one.
    Replaced(String),
}

impl PinReport {
    /// Whether every one of `names` was reused with its contents.
    pub fn kept(&self, names: &[&str]) -> bool {
        names
            .iter()
            .all(|name| self.maps.get(*name) == Some(&Pinned::Kept))
    }
}

impl PinDir {
    /// `path` as `[daemon] bpf_pin_dir` gives it: absolute, without `.` or `..`.
    pub fn new(path: impl Into<PathBuf>) -> anyhow::Result<Self> {
        let path = path.into();
        if !path.is_absolute() {
            bail!(
                "daemon.bpf_pin_dir: `{}` must be an absolute path (on a BPF filesystem)",
                path.display()
            );
        }
        if path
            .components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
        {
            bail!(
                "daemon.bpf_pin_dir: `{}` must not contain `.` or `..`",
                path.display()
            );
        }
        if path.parent().is_none() {
            bail!("daemon.bpf_pin_dir: `/` is not a directory of its own");
        }
        Ok(PinDir {
            path,
            key: String::new(),
        })
    }

    /// The maps of an LB whose secret has `fingerprint` (`Secret::fingerprint`, which
    /// the cookie layout enters too): maps pinned under another are not reused.
    pub fn for_key(self, fingerprint: &str) -> Self {
        PinDir {
            key: fingerprint.to_string(),
            ..self
        }
    }

    /// The default for an instance on `interfaces` in this network namespace:
    /// `DEFAULT_ROOT/netns-<cookie>-<interface>`. The namespace's cookie is never reused
    /// while the host runs (unlike its inode number), and no two instances in one
    /// namespace share an interface (each attaches XDP to all of its own), so no two
    /// running instances share it; the smallest interface name, so that adding an
    /// interface keeps the state.
    pub fn default_for(interfaces: &[String]) -> anyhow::Result<Self> {
        let interface = interfaces
            .iter()
            .min()
            .context("daemon.interfaces: at least one interface is needed")?;
        let cookie = netns_cookie().context(
            "daemon.bpf_pin_dir: cannot tell this network namespace apart for the default; set bpf_pin_dir",
        )?;
        Self::new(Path::new(DEFAULT_ROOT).join(format!("netns-{cookie:x}-{interface}")))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory the maps of this build's layout and this key are pinned in.
    fn layout_dir(&self) -> PathBuf {
        self.path
            .join(format!("layout-{PIN_LAYOUT}-key-{}", self.key))
    }

    /// Creates the directory on a BPF filesystem. Under [`DEFAULT_ROOT`] it mounts one
    /// there first if there is none, unless this process has a mount namespace of its own
    /// (e.g. under `ip netns exec`), where the mount, and the pins with it, would vanish
    /// with the process.
    pub fn create(&self) -> anyhow::Result<()> {
        if !on_bpffs(&self.path)? {
            let root = Path::new(DEFAULT_ROOT);
            if !self.path.starts_with(root) {
                bail!(
                    "daemon.bpf_pin_dir: {} is not on a BPF filesystem; mount one (`mount -t bpf bpf <dir>`) or use the default under {DEFAULT_ROOT}",
                    self.path.display()
                );
            }
            mount_default_root()?;
        }
        std::fs::create_dir_all(self.layout_dir()).with_context(|| {
            format!(
                "daemon.bpf_pin_dir: cannot create {}",
                self.layout_dir().display()
            )
        })
    }

    /// Takes the directory for this process alone, until it exits (`kill -9` too): a second
    /// `cheetah run` on the same maps (the same config started twice, or another with the
    /// same `bpf_pin_dir`) would clear or overwrite the words the running LB's program and
    /// workers share, so it must fail before it loads anything. The lock is the kernel's
    /// `flock` on the directory, which dies with its holder: no stale lock file to clean.
    pub fn lock(&self) -> anyhow::Result<PinLock> {
        self.create()?;
        let dir = std::fs::File::open(&self.path)
            .with_context(|| format!("daemon.bpf_pin_dir: cannot open {}", self.path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&dir),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                bail!(
                    "daemon.bpf_pin_dir: {} is in use by another running `cheetah run` (its XDP maps); stop it first, or give this instance a bpf_pin_dir of its own",
                    self.path.display()
                );
            }
            return Err(error).with_context(|| {
                format!("daemon.bpf_pin_dir: cannot lock {}", self.path.display())
            });
        }
        Ok(PinLock { _dir: dir })
    }

    /// Removes every pinned map (the kernel frees each once no program uses it): the next
    /// start begins with fresh state. Nothing to remove is fine.
    pub fn forget(&self) -> anyhow::Result<()> {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove {}", self.path.display())),
        }
    }
}

/// A pin directory held by this process ([`PinDir::lock`]); released when dropped or when
/// the process ends.
pub struct PinLock {
    _dir: std::fs::File,
}

/// Removes the pin directory of a start that pinned only fresh maps and fails before its
/// program is attached (a missing interface, a busy API address): nothing uses those
/// maps, and no later start should take them for an earlier run's state. An earlier
/// run's kept maps are never removed.
pub struct UnusedPins<'a> {
    dir: Option<&'a PinDir>,
}

impl<'a> UnusedPins<'a> {
    pub fn new(dir: &'a PinDir, report: &PinReport) -> Self {
        let fresh = !report.maps.values().any(|p| *p == Pinned::Kept);
        UnusedPins {
            dir: fresh.then_some(dir),
        }
    }

    /// The program is attached: its maps are in use, the pins stay.
    pub fn in_use(mut self) {
        self.dir = None;
    }
}

impl Drop for UnusedPins<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.dir {
            if let Err(e) = dir.forget() {
                tracing::warn!(error = %format!("{e:#}"), "cannot remove the pins of a failed start");
            }
        }
    }
}

/// The file in an LB's state directory that names its pin directory: the one place an
/// operator or a testbed finds it (the default's name depends on the namespace, which may
/// be gone by then).
pub const RECORD_FILE: &str = "bpf_pin_dir";

/// Writes `dir` into `state_dir`'s [`RECORD_FILE`].
pub fn record(state_dir: &Path, dir: &PinDir) -> anyhow::Result<()> {
    let path = state_dir.join(RECORD_FILE);
    std::fs::write(&path, format!("{}\n", dir.path().display()))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Removes the pin directory `state_dir`'s [`RECORD_FILE`] names, and the record: what a
/// testbed's teardown does for each LB, whose namespace goes too. Only a directory on a
/// BPF filesystem is removed, whatever the file says. Returns what was removed.
pub fn forget_recorded(state_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let path = state_dir.join(RECORD_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let dir = PinDir::new(text.trim()).with_context(|| format!("in {}", path.display()))?;
    if dir.path().exists() && !is_bpffs(dir.path())? {
        bail!(
            "{} names {}, which is not on a BPF filesystem: not removed",
            path.display(),
            dir.path().display()
        );
    }
    dir.forget()?;
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    Ok(Some(dir.path().to_path_buf()))
}

/// Mounts a BPF filesystem on [`DEFAULT_ROOT`] unless one is there. Refused in a mount
/// namespace of this process's own: the mount would not outlive it.
pub fn mount_default_root() -> anyhow::Result<()> {
    let root = Path::new(DEFAULT_ROOT);
    if root.exists() && is_bpffs(root)? {
        return Ok(());
    }
    if in_private_mount_namespace() {
        bail!(
            "daemon.bpf_pin_dir: no BPF filesystem on {DEFAULT_ROOT}, and this process runs in a mount namespace of its own \
             (e.g. under `ip netns exec`), where one would vanish with it: mount it in the host first \
             (`mkdir -p {DEFAULT_ROOT} && mount -t bpf bpf {DEFAULT_ROOT}`; scripts/setup.sh does)"
        );
    }
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {DEFAULT_ROOT}"))?;
    let target = CString::new(DEFAULT_ROOT).expect("no NUL in the default root");
    let fstype = CString::new("bpf").unwrap();
    let options = CString::new("mode=0700").unwrap();
    // SAFETY: NUL-terminated strings that outlive the call.
    let mounted = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    };
    if mounted != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| {
            format!(
                "daemon.bpf_pin_dir: cannot mount a BPF filesystem on {DEFAULT_ROOT} (needs root)"
            )
        });
    }
    tracing::info!(
        root = DEFAULT_ROOT,
        "mounted a BPF filesystem for pinned maps"
    );
    Ok(())
}

/// Whether `path`, or its nearest existing ancestor, is on a BPF filesystem.
fn on_bpffs(path: &Path) -> anyhow::Result<bool> {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    is_bpffs(existing)
}

fn is_bpffs(path: &Path) -> anyhow::Result<bool> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} holds a NUL byte", path.display()))?;
    // SAFETY: statfs fills the zeroed struct for a NUL-terminated path.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot statfs {}", path.display()));
    }
    Ok(stat.f_type as u64 == libc::BPF_FS_MAGIC as u64)
}

/// Whether this process has a mount namespace its parent does not share: what `ip netns
/// exec` (and a systemd unit with private mounts) makes, where a mount is gone with the
/// process. When the parent's cannot be read, a mount is tried (and may not outlive us).
fn in_private_mount_namespace() -> bool {
    let inode = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    // SAFETY: getppid has no preconditions.
    let parent = format!("/proc/{}/ns/mnt", unsafe { libc::getppid() });
    match (inode("/proc/self/ns/mnt"), inode(&parent)) {
        (Some(mine), Some(parents)) => mine != parents,
        _ => {
            tracing::warn!(
                "cannot tell whether this process has a mount namespace of its own; if it has, the BPF filesystem mounted on {DEFAULT_ROOT} and the pins in it go with it"
            );
            false
        }
    }
}

/// This network namespace's cookie (`SO_NETNS_COOKIE`): unique while the host runs.
fn netns_cookie() -> anyhow::Result<u64> {
    // SAFETY: a plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for the kernel to write 8 bytes and a length.
    let got = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    let error = std::io::Error::last_os_error();
    // SAFETY: our own fd, closed once.
    unsafe { libc::close(fd) };
    if got != 0 {
        return Err(error).context("getsockopt(SO_NETNS_COOKIE) (needs Linux 5.14)");
    }
    Ok(cookie)
}

/// Whether the rule pins `map` (see the module doc).
fn pinned_by_rule(name: &str, map_type: MapType) -> bool {
    let holds_fds = matches!(
        map_type,
        MapType::Xskmap
            | MapType::Devmap
            | MapType::DevmapHash
            | MapType::Cpumap
            | MapType::ProgArray
            | MapType::ArrayOfMaps
            | MapType::HashOfMaps
            | MapType::Sockmap
            | MapType::Sockhash
            | MapType::ReuseportSockarray
            | MapType::PerfEventArray
    );
    let cache = name.ends_with("_cache");
    let scratch = name.ends_with("_scratch");
    // libbpf names its internal maps `<object>.rodata` and the like.
    !holds_fds && !cache && !scratch && !name.contains('.')
}

/// A map's definition as the kernel compares it for reuse.
#[derive(Debug, PartialEq, Eq)]
struct Definition {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
}

impl Definition {
    fn of_open(map: &OpenMapMut<'_>) -> Self {
        let raw = map.as_libbpf_object().as_ptr();
        // SAFETY: `raw` is the open map's libbpf object, valid while `map` is.
        unsafe {
            Definition {
                map_type: libbpf_sys::bpf_map__type(raw),
                key_size: libbpf_sys::bpf_map__key_size(raw),
                value_size: libbpf_sys::bpf_map__value_size(raw),
                max_entries: libbpf_sys::bpf_map__max_entries(raw),
                flags: libbpf_sys::bpf_map__map_flags(raw),
            }
        }
    }

    fn of_pinned(info: &MapInfo) -> Self {
        Definition {
            map_type: info.info.type_,
            key_size: info.info.key_size,
            value_size: info.info.value_size,
            max_entries: info.info.max_entries,
            flags: info.info.map_flags,
        }
    }

    fn differences(&self, pinned: &Definition) -> String {
        let mut why = Vec::new();
        let mut field = |name: &str, new: u32, old: u32| {
            if new != old {
                why.push(format!("{name} {old} -> {new}"));
            }
        };
        field("type", self.map_type, pinned.map_type);
        field("key size", self.key_size, pinned.key_size);
        field("value size", self.value_size, pinned.value_size);
        field("entries", self.max_entries, pinned.max_entries);
        field("flags", self.flags, pinned.flags);
        why.join(", ")
    }
}

/// Points every map the rule pins of the opened (not yet loaded) `open` at `dir`: a pinned
/// map of the same definition is reused by libbpf at load, with what it holds; any other
/// pinned map of that name is removed first, so libbpf creates and pins a fresh one. Maps
/// pinned under another [`PIN_LAYOUT`] are removed. Logs what was replaced and why.
pub fn prepare(open: &mut OpenObject, dir: &PinDir) -> anyhow::Result<PinReport> {
    dir.create()?;
    let mut report = PinReport::default();
    let mut other_layouts = BTreeMap::new();
    for entry in std::fs::read_dir(dir.path())
        .with_context(|| format!("daemon.bpf_pin_dir: cannot read {}", dir.path().display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("layout-") && entry.path() != dir.layout_dir() {
            for map in std::fs::read_dir(entry.path())?.flatten() {
                other_layouts.insert(map.file_name().to_string_lossy().into_owned(), name.clone());
            }
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    for mut map in open.maps_mut() {
        let name = map.name().to_string_lossy().into_owned();
        if !pinned_by_rule(&name, map.map_type()) {
            continue;
        }
        let path = dir.layout_dir().join(&name);
        let wanted = Definition::of_open(&map);
        let state = if path.exists() {
            let pinned = MapHandle::from_pinned_path(&path)
                .and_then(|handle| MapInfo::new(handle.as_fd()))
                .map(|info| Definition::of_pinned(&info));
            match pinned {
                Ok(pinned) if pinned == wanted => Pinned::Kept,
                Ok(pinned) => Pinned::Replaced(format!(
                    "its definition changed ({})",
                    wanted.differences(&pinned)
                )),
                Err(e) => Pinned::Replaced(format!("it cannot be opened ({e})")),
            }
        } else if let Some(layout) = other_layouts.get(&name) {
            Pinned::Replaced(format!(
                "it was pinned under {layout} (another build's layout, or another key or cookie layout), this run's is {}",
                dir.layout_dir().file_name().unwrap_or_default().to_string_lossy()
            ))
        } else {
            Pinned::New
        };
        if let Pinned::Replaced(why) = &state {
            tracing::warn!(map = %name, reason = %why, "pinned map replaced: it starts fresh");
            if path.exists() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot unpin {}", path.display()))?;
            }
        }
        map.set_pin_path(&path)
            .with_context(|| format!("cannot pin map {name} at {}", path.display()))?;
        report.maps.insert(name, state);
    }
    let kept: Vec<&str> = report
        .maps
        .iter()
        .filter(|(_, s)| **s == Pinned::Kept)
        .map(|(n, _)| n.as_str())
        .collect();
    tracing::info!(
        dir = %dir.layout_dir().display(),
        kept = kept.len(),
        fresh = report.maps.len() - kept.len(),
        "XDP maps pinned{}",
        if kept.is_empty() { "" } else { ": an earlier run's state continues" }
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_dir_is_absolute_and_plain() {
        assert!(PinDir::new("/run/cheetah/bpf/lb1").is_ok());
        for bad in ["relative/dir", "/run/../etc", "/"] {
            let e = PinDir::new(bad).unwrap_err().to_string();
            assert!(e.starts_with("daemon.bpf_pin_dir: "), "{bad}: {e}");
        }
    }

    #[test]
    fn a_pin_dir_off_a_bpf_filesystem_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let e = PinDir::new(dir.path().join("pins"))
            .unwrap()
            .create()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("daemon.bpf_pin_dir: ") && e.contains("not on a BPF filesystem"),
            "{e}"
        );
    }

    #[test]
    fn the_rule_leaves_out_fd_maps_and_internal_maps() {
        assert!(pinned_by_rule("handshakes", MapType::Array));
        assert!(pinned_by_rule("stats", MapType::PercpuArray));
        assert!(!pinned_by_rule("xsks", MapType::Xskmap));
        assert!(!pinned_by_rule("next_hop_cache", MapType::PercpuArray));
        assert!(!pinned_by_rule("option_walk_scratch", MapType::PercpuArray));
        assert!(!pinned_by_rule("xdp_lb.rodata", MapType::Array));
        assert!(!pinned_by_rule("anything", MapType::Devmap));
    }

    #[test]
    fn the_default_names_the_namespace_and_the_smallest_interface() {
        let dir = PinDir::default_for(&["veth9".into(), "eth0".into()]).unwrap();
        let name = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(dir.path().starts_with(DEFAULT_ROOT));
        assert!(
            name.starts_with("netns-") && name.ends_with("-eth0"),
            "{name}"
        );
        assert_eq!(
            dir,
            PinDir::default_for(&["eth0".into(), "veth9".into()]).unwrap()
        );
    }
}
