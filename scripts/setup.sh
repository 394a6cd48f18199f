#!/usr/bin/env bash
# Installs what building and testing cheetah needs on a fresh Debian 12 machine.
# Idempotent: already-present tools are left alone.
set -euo pipefail

need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v valgrind >/dev/null || need_apt+=(valgrind)
# `cheetah sim` draws its plots' text with this font (no fontconfig/freetype needed).
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# The XDP program (bpf/) is built with clang against libbpf's headers; libbpf-sys links
# libelf and zlib.
command -v clang >/dev/null || need_apt+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need_apt+=(libbpf-dev)
[ -f /usr/include/libelf.h ] || need_apt+=(libelf-dev)
[ -f /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
# `cheetah testbed` (docs/testbed.md): namespaces, veths and their offloads, nginx servers
# with the echo module for /slow, and the tools its checks and tests use.
command -v ip >/dev/null || need_apt+=(iproute2)
command -v ethtool >/dev/null || need_apt+=(ethtool)
command -v tcpdump >/dev/null || need_apt+=(tcpdump)
# `cheetah testbed throughput` drives its load with wrk.
command -v wrk >/dev/null || need_apt+=(wrk)
command -v curl >/dev/null || need_apt+=(curl)
command -v ping >/dev/null || need_apt+=(iputils-ping)
# The live SYN-retry test drops SYN-ACKs on the testbed's switch with nftables.
command -v nft >/dev/null || need_apt+=(nftables)
command -v nginx >/dev/null || need_apt+=(nginx-light)
[ -f /usr/lib/nginx/modules/ngx_http_echo_module.so ] || need_apt+=(libnginx-mod-http-echo)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${need_apt[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

# `cheetah run` pins its XDP maps under /run/cheetah/bpf by default ([daemon] bpf_pin_dir
# in the README): a BPF filesystem there, mounted in the host, so that an LB started under
# `ip netns exec` (which hides /sys/fs/bpf) finds its pins after a restart.
if [ "$(id -u)" -eq 0 ] && [ "$(stat -f -c %T /run/cheetah/bpf 2>/dev/null)" != bpf_fs ]; then
  mkdir -p /run/cheetah/bpf
  mount -t bpf -o mode=0700 bpf /run/cheetah/bpf
fi

if ! command -v cargo >/dev/null; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: cargo not found; install Rust (rustup) first" >&2
    exit 1
  fi
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
