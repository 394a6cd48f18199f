//! `cheetah bench --xdp` and `--xdp-flows`, run briefly through the built binary: every
//! program of `bpf/xdp_bench.c` must pass the verifier, and every row must time the path it
//! names (a row whose program took another path, or returned another action, is printed as
//! void). The figures themselves are benchmarks (docs/benchmarks.md), not checked here.

use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cheetah"))
        .arg("bench")
        .args(args)
        .output()
        .expect("cannot run the cheetah binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`cheetah bench {}` failed: {}\n{stdout}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !stdout.contains("void"),
        "`cheetah bench {}` has void rows:\n{stdout}",
        args.join(" ")
    );
    stdout
}

#[test]
fn every_xdp_bench_row_times_its_own_path() {
    if !is_root() {
        eprintln!(
            "SKIPPED: cheetah bench --xdp needs root (BPF_PROG_TEST_RUN, a network namespace)"
        );
        return;
    }
    let table = bench(&["--xdp", "--xdp-runs", "300", "--markdown"]);
    for row in [
        "established client->server",
        "server->client",
        "plain hash",
        "forged cookie, dropped",
        "ping of the VIP, dropped",
        "clock unstable (not learnt)",
        "ICMP error by the fallback table",
    ] {
        assert!(table.contains(row), "no row {row:?} in:\n{table}");
    }
    let curves = bench(&[
        "--xdp-flows",
        "--xdp-flows-max",
        "1000",
        "--xdp-runs",
        "300",
    ]);
    assert!(
        curves.contains("1000"),
        "no point at 1000 flows in:\n{curves}"
    );
}
