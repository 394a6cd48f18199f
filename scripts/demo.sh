#!/usr/bin/env bash
# The demo: builds cheetah, then shows in one screen what it prevents and what it costs.
#  1. the same churn (server added, drained, removed from the pool, policy changed) over
#     20,000 open connections, in cheetah, plain-hash and Maglev modes;
#  2. the per-packet cost of each mode on a generated trace (a short cheetah bench).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== building (release)"
cargo build --release --locked -p cheetah -p cheetah-core --examples --bins 2>&1 | tail -1

echo
echo "== 1. per-connection consistency under churn"
cargo run --release --locked -q -p cheetah-core --example churn -- 20000

echo
echo "== 2. cost per packet (a short cheetah bench; the full run is in docs/benchmarks.md)"
./target/release/cheetah bench --runs 5 --path established,server,element,siphash
