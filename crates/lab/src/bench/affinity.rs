//! Pinning the benchmark thread to one core.
//!
//! A thread the scheduler moves between cores loses its warm L1/L2 and branch predictors
//! mid-run and mixes two cores' frequencies into one figure; pinned, every run sees the
//! same core. The mask is given back afterwards so the callgrind children, which inherit
//! it, can run on every core.

/// The CPU mask the thread had before [`pin_to`], to put back with [`Pinned::release`].
pub struct Pinned {
    #[cfg(target_os = "linux")]
    previous: libc::cpu_set_t,
}

/// Pins the calling thread to `core`; the error says why it could not.
#[cfg(target_os = "linux")]
pub fn pin_to(core: usize) -> std::io::Result<Pinned> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if core >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    // SAFETY: cpu_set_t is plain data and zeroed is the empty set; CPU_SET stays within the
    // set for core < CPU_SETSIZE (checked above); the syscalls read or write `size` bytes
    // of sets we own.
    unsafe {
        let mut previous: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut previous) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, size, &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Pinned { previous })
    }
}

#[cfg(not(target_os = "linux"))]
pub fn pin_to(_core: usize) -> std::io::Result<Pinned> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

impl Pinned {
    /// Lets the thread (and the processes it starts) run anywhere it could before.
    pub fn release(self) {
        #[cfg(target_os = "linux")]
        // SAFETY: `previous` is a set sched_getaffinity filled in.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.previous);
        }
    }
}

/// CPUs online (not just those this thread may use).
pub fn cpus() -> usize {
    #[cfg(target_os = "linux")]
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    #[cfg(not(target_os = "linux"))]
    let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
    n.max(1) as usize
}

/// The last core: on a shared machine, core 0 takes most interrupts and housekeeping.
pub fn default_core() -> usize {
    cpus() - 1
}

/// While held, the thread runs under `SCHED_FIFO`: ordinary (CFS) processes no longer
/// preempt it on its core, so on a machine shared with builds and fuzzers the runs stop
/// measuring other people's jobs. The kernel's RT throttling (by default 50 ms of every
/// second left to others) keeps the machine usable; [`Realtime::release`] goes back to
/// normal scheduling before anything long (the callgrind children) starts.
pub struct Realtime(());

#[cfg(target_os = "linux")]
pub fn realtime() -> std::io::Result<Realtime> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: plain syscall on this thread with a valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Realtime(()))
}

#[cfg(not(target_os = "linux"))]
pub fn realtime() -> std::io::Result<Realtime> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

impl Realtime {
    pub fn release(self) {
        #[cfg(target_os = "linux")]
        {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as above.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        }
    }
}
