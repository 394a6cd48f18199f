#!/usr/bin/env bash
# The test command: formatting, lints, the API docs, and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
# A fresh clone never reuses incremental state; writing it only costs disk.
export CARGO_INCREMENTAL=0
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The API docs build without a broken link or a warning.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line for the whole workspace (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log"
