#!/usr/bin/env bash
# The demo: per-connection consistency with real TCP stacks under churn, side by side with
# plain hashing (docs/churn.md).
#
#  1. (a few seconds) the core alone: the same churn over 20,000 simulated connections in
#     cheetah, plain-hash and Maglev modes;
#  2. the main show, about 6 minutes: `cheetah testbed churn` builds a testbed with 8 nginx
#     servers in network namespaces, runs `cheetah run` (XDP datapath) in front of them and drives
#     hundreds of real Linux TCP connections through it (some idle 40 s between requests,
#     some 100 s, longer than a period of the servers' timestamp MSB) while servers are added, drained
#     and removed, the policy goes rr -> pow2 -> awrr and the LB is restarted twice
#     (SIGTERM, kill -9). Once in cheetah mode, once in hash mode, same schedule;
#  3. (about 1.5 minutes) the same churn, shorter (--lbs-duration, 60 s) and without the
#     sessions idle 100 s, with two LB instances behind an ECMP router, cheetah mode: same
#     config and key on both, each joining the router's pool once ready, restarted one at
#     a time, the servers' replies crossing either instance;
#  4. a side-by-side table (printed, and churn-table.md; the two-instance run is the line
#     under it) and a plot of broken connections over time (broken-over-time.png), in
#     results/demo-<timestamp>/ or --out DIR.
#
# Usage: scripts/demo.sh [--out DIR] [--duration 150s] [--lbs-duration 60s] [--servers 8]
#                        [--forwarding l2|nat]
# Needs root (namespaces, XDP); installs what it needs on a fresh Debian 12 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

out="results/demo-$(date +%Y%m%d-%H%M%S)"
duration=150s
lbs_duration=60s
servers=8
forwarding=l2
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --lbs-duration) lbs_duration=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --forwarding) forwarding=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "demo: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: needs root (network namespaces, XDP): run it with sudo" >&2
  exit 1
fi

bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== building (release)"
cargo build --release --locked -p cheetah -p cheetah-core --examples --bins 2>&1 | tail -1
cheetah="${CARGO_TARGET_DIR:-target}/release/cheetah"

echo
echo "== 1. the core alone: the same churn over 20,000 simulated connections"
cargo run --release --locked -q -p cheetah-core --example churn -- 20000

mkdir -p "$out"
# The runner stops its load on Ctrl-C, writes what it measured, tears its testbed down and
# exits non-zero, which ends the demo here too.
for mode in cheetah hash; do
  echo
  echo "== 2. churn with real TCP, $mode mode ($duration, $servers servers, $forwarding forwarding)"
  "$cheetah" testbed churn --mode "$mode" --prefix chd --servers "$servers" \
    --duration "$duration" --forwarding "$forwarding" --out "$out" --progress
done

echo
echo "== 3. churn with two LB instances behind an ECMP router, cheetah mode ($lbs_duration, $servers servers, $forwarding forwarding)"
"$cheetah" testbed churn --mode cheetah --lbs 2 --prefix chd --servers "$servers" \
  --duration "$lbs_duration" --long-idle-sessions 0 --forwarding "$forwarding" --out "$out" --progress

echo
echo "== 4. side by side"
"$cheetah" testbed churn-report --cheetah "$out/cheetah.json" --hash "$out/hash.json" \
  --more "$out/cheetah-2lbs.json" --out "$out"
