//! The daemon is the load balancer as it runs in production: it must not pull in the lab
//! (testbed, churn, loadgen, bench, replay), the simulator, or the libraries only they use.
//! A `use` of the lab from the daemon would still compile if the dependency were added, so
//! the dependency graph itself is checked.

use std::path::Path;
use std::process::Command;

/// Crates of the lab side; none may be a normal dependency of the daemon.
const LAB_ONLY: [&str; 4] = ["cheetah-lab", "cheetah-sim", "plotters", "pcap-file"];

#[test]
fn the_daemon_does_not_pull_the_lab() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/daemon sits two levels below the workspace root");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-e", "normal", "-p", "cheetah-daemon"])
        // One crate per line, as `name vX.Y.Z`, and no network: the test build has
        // fetched everything already.
        .args(["--prefix", "none", "--locked", "--offline"])
        .current_dir(workspace)
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo tree failed: {stderr}");
    let tree = String::from_utf8(out.stdout).expect("cargo tree prints UTF-8");
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    // Not vacuous: the tree is the daemon's, with its dependencies.
    assert!(
        crates.contains(&"cheetah-daemon") && crates.contains(&"cheetah-core"),
        "not the daemon's dependency tree:\n{tree}"
    );
    let pulled: Vec<&str> = LAB_ONLY
        .into_iter()
        .filter(|name| crates.contains(name))
        .collect();
    assert!(
        pulled.is_empty(),
        "the daemon depends on {pulled:?}, which belong to the lab; `cargo tree -e normal -p cheetah-daemon -i <crate>` shows the path"
    );
}
