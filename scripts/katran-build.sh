#!/usr/bin/env bash
# Builds Katran's XDP program (facebookincubator/katran, katran/lib/bpf/balancer.bpf.c)
# outside this repository, for `cheetah bench --xdp --xdp-katran OBJECT`
# (crates/lab/src/bench/xdp_katran.rs). Nothing of Katran is copied into cheetah: the
# source is cloned into a work directory and compiled there with the flags of Katran's own
# katran/lib/Makefile-bpf (clang to LLVM IR, llc to BPF), default defines.
#
#   scripts/katran-build.sh [OUT.o]          clones Katran into ${KATRAN_WORK:-/tmp/katran-build}
#   KATRAN_SRC=/path/to/katran scripts/katran-build.sh OUT.o   uses a checkout you have
#
# The commit is pinned: xdp_katran.rs writes Katran's map structs as of this commit and
# refuses an object whose map sizes differ.
set -euo pipefail

KATRAN_COMMIT=19f08fec82fb7b5fb14d935a80057bdc0897c8de
out=$(realpath -m "${1:-${KATRAN_WORK:-/tmp/katran-build}/balancer.o}")
work=${KATRAN_WORK:-/tmp/katran-build}
mkdir -p "$work" "$(dirname "$out")"

if [ -n "${KATRAN_SRC:-}" ]; then
    src=$KATRAN_SRC
else
    src=$work/katran
    if [ ! -d "$src/.git" ]; then
        git clone --quiet https://github.com/facebookincubator/katran "$src"
    fi
    git -C "$src" fetch --quiet origin "$KATRAN_COMMIT" 2>/dev/null || true
    git -C "$src" checkout --quiet "$KATRAN_COMMIT"
fi
[ -f "$src/katran/lib/bpf/balancer.bpf.c" ] || {
    echo "katran-build: $src has no katran/lib/bpf/balancer.bpf.c" >&2
    exit 1
}

clang=$(command -v clang-14 || command -v clang)
llc=$(command -v llc-14 || command -v llc)
cd "$src"
"$clang" -I. -DDEBUG -D__KERNEL__ -Wno-unused-value -Wno-pointer-sign \
    -Wno-compare-distinct-pointer-types -O2 -emit-llvm -c -g \
    katran/lib/bpf/balancer.bpf.c -o - |
    "$llc" -march=bpf -filetype=obj -o "$out"
echo "$out (Katran $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "$KATRAN_COMMIT"))"
