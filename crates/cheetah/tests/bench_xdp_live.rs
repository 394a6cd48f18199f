//! `cheetah bench --xdp-live`, run briefly through the built binary: both runs (the XDP_TX
//! reflector and cheetah_lb) must be well formed: packets counted where the sender's veth
//! hands them over, at the LB's veth and back at the sink, every one handled by the
//! program's own path (cheetah's STAT_FAST_CLIENT_COOKIE) on the LB's CPU. A run may be
//! void only for load (the LB's CPU less than 95% busy), which depends on the machine and
//! what else runs on it; the figures are benchmarks (docs/benchmarks.md), not checked here.
//! On a kernel that refuses BPF_PROG_TEST_RUN's live frames the bench feeds the veth from
//! an AF_PACKET socket instead (napi-thread), and refuses cpumap steering, which needs
//! them, with an error that says so.

use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn both_live_runs_are_well_formed() {
    if !is_root() {
        eprintln!("SKIPPED: cheetah bench --xdp-live needs root (namespaces, XDP programs)");
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("SKIPPED: cheetah bench --xdp-live needs 2 CPUs");
        return;
    }
    // Both ways of putting the LB's veth NAPI on the LB's CPU.
    for steer in ["napi-thread", "cpumap"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cheetah"))
            .args(["bench", "--xdp-live", "--xdp-live-prefix", "p2"])
            .args(["--xdp-live-steer", steer])
            .args(["--xdp-live-seconds", "1", "--xdp-live-warm-up", "0.5"])
            .args(["--xdp-live-flows", "64", "--markdown"])
            .output()
            .expect("cannot run the cheetah binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if steer == "cpumap"
            && !out.status.success()
            && stderr.contains("needs BPF_PROG_TEST_RUN live frames, which this kernel refuses")
        {
            eprintln!("cpumap: not run, this kernel refuses live frames: {stderr}");
            continue;
        }
        assert!(
            out.status.success(),
            "`cheetah bench --xdp-live --xdp-live-steer {steer}` failed: {stderr}\n{stdout}"
        );
        for program in ["xdp_reflect", "cheetah_lb"] {
            let row = stdout
                .lines()
                .find(|line| line.starts_with(&format!("| {program} |")))
                .unwrap_or_else(|| panic!("no row for {program} in:\n{stdout}"));
            let verdict = row.rsplit('|').nth(1).unwrap().trim();
            assert!(
                verdict == "valid" || verdict.starts_with("void (load)"),
                "{steer}: the {program} run is void for another reason than load: {verdict}\n{stdout}"
            );
        }
        assert!(
            stdout.contains("target cheetah_lb >= 0.7x the reflector"),
            "no target line in:\n{stdout}"
        );
    }
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&namespaces.stdout).contains("p2-xl-"),
        "the bench left its namespaces behind"
    );
}
