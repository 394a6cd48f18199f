//! Keeping a test thread on one CPU, for tests of the program's per-CPU state (policy
//! cursors, the next-hop cache, the last clock sample): every run of the program from the
//! thread then sees the same CPU's entries.

/// Pins this thread to the CPU it runs on, and returns that CPU.
pub fn pin_to_this_cpu() -> usize {
    // SAFETY: plain libc calls on this thread's own affinity, with a zeroed cpu_set_t.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(
            cpu >= 0,
            "sched_getcpu: {}",
            std::io::Error::last_os_error()
        );
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
        cpu as usize
    }
}
