#!/usr/bin/env bash
# Where the verifier spends its budget on the XDP program: loads bpf/xdp_lb.c with the
# verifier's full log (level 2: every instruction it walks, in every state) and counts the
# walked instructions by the source file and line that emitted them. The kernel refuses a
# program past 1,000,000 processed instructions; this says which code to restructure
# (docs/dataplane.md, "The verifier's budget"). Needs root, clang and libbpf-dev
# (scripts/setup.sh installs them).
#
#   scripts/verifier-profile.sh [LINES]      the top LINES source lines (default 30)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

clang -O2 -g -target bpf -Wall -Werror -I/usr/include/"$(uname -m)"-linux-gnu \
    -I"$root/bpf/include" -c "$root/bpf/xdp_lb.c" -o "$work/lb.o"

cat > "$work/load.c" <<'C'
#include <bpf/libbpf.h>
#include <stdio.h>
#include <stdlib.h>

// Loads the object with every program's verifier log at level 2 into one buffer (the
// kernel keeps the newest part if it overflows) and writes the log to argv[2].
int main(int argc, char **argv)
{
	size_t size = 1000000000; // under the kernel's limit of UINT_MAX >> 2
	char *log = calloc(1, size);
	struct bpf_object *object = bpf_object__open_file(argv[1], NULL);
	struct bpf_program *program;
	FILE *out;

	if (!log || !object)
		return 1;
	bpf_object__for_each_program(program, object) {
		bpf_program__set_log_level(program, 2);
		bpf_program__set_log_buf(program, log, size);
	}
	if (bpf_object__load(object))
		fprintf(stderr, "the load failed; the log is what the verifier walked\n");
	out = fopen(argv[2], "w");
	if (!out)
		return 1;
	fputs(log, out);
	return fclose(out) != 0;
}
C
cc -O2 "$work/load.c" -o "$work/load" -lbpf
"$work/load" "$work/lb.o" "$work/verifier.log" 2> >(grep -v '^libbpf:' >&2) || true

python3 - "$work/verifier.log" "${1:-30}" <<'PY'
import collections, re, sys

# A walked instruction is "N: (op) ..."; the source line it comes from is the last
# "; code @ file:line" the verifier printed before instruction N was first walked.
line_of, walks, source = {}, collections.Counter(), None
instruction = re.compile(r'^(\d+): \(')
for text in open(sys.argv[1], errors='replace'):
    if text.startswith('; ') and ' @ ' in text:
        source = text[text.rfind(' @ ') + 3:].strip()
        continue
    m = instruction.match(text)
    if m:
        at = int(m.group(1))
        line_of.setdefault(at, source or '?')
        walks[at] += 1
total = sum(walks.values())
by_file, by_line = collections.Counter(), collections.Counter()
for at, n in walks.items():
    by_line[line_of[at]] += n
    by_file[line_of[at].split(':')[0]] += n
for text in open(sys.argv[1], errors='replace'):
    if text.startswith('processed '):
        print(text.strip())
print(f'{total} walks of {len(walks)} instructions in the log, by file:')
for name, n in by_file.most_common():
    print(f'{n:9d} {100 * n / total:5.1f}%  {name}')
print(f'the {sys.argv[2]} busiest source lines:')
for name, n in by_line.most_common(int(sys.argv[2])):
    print(f'{n:9d}  {name}')
PY
