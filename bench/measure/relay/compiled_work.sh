#!/usr/bin/env bash
# Instructions per upstream event of the relay's work (bench/measure/relay/relay_work.py under callgrind), per
# surface, null and real detector: this checkout's pure-Python sources against a wheel of the same
# tree whose per-event modules (bench/measure/relay/mypyc/modules.py) are compiled with mypyc; plus the wheel's
# build time and size. Callgrind counts instructions, which the machine's load does not move.
#
# Usage: bash bench/measure/relay/compiled_work.sh [STREAMS [REPS]]     (default 16 streams, 2 repetitions)
# Needs: valgrind, gcc and Python's headers, the project's dependencies in python3's environment
# (mypy-extensions among them, a mypy dependency); the build fetches its own requirements
# (setuptools, wheel, mypy) from the package index.
#
# The wheel is built from a scratch copy of the tracked files with two build-only edits the
# package itself does not carry: bench/measure/relay/mypyc/setup.py as its setup.py (mypy added to the build
# requirements), and Detector and SSEParser marked to accept subclasses written in Python
# (mypyc_attr: the null detector and some tests subclass them).
set -euo pipefail
cd "$(dirname "$0")/../../.."
streams=${1:-16}
reps=${2:-2}
PY=$(python3 -c 'import sys; print(sys.executable)')  # the interpreter, not a shim
work=$(mktemp -d /tmp/cg-compiled-work.XXXXXX)
trap 'rm -rf "$work"' EXIT

mkdir "$work/src"
git ls-files -z | tar --null -T - -c | tar -x -C "$work/src"
cp bench/measure/relay/mypyc/setup.py "$work/src/setup.py"
"$PY" - "$work/src" <<'EOF'
import sys
from pathlib import Path

src = Path(sys.argv[1])
edits = [
    ("pyproject.toml", 'requires = ["setuptools>=77", "wheel"]',
     'requires = ["setuptools>=77", "wheel", "mypy==2.4.1"]'),
    ("proxy/detect/detector.py", "\nclass Detector:",
     "\n@mypyc_attr(allow_interpreted_subclasses=True)\nclass Detector:"),
    ("proxy/core/sse.py", "\nclass SSEParser:",
     "\n@mypyc_attr(allow_interpreted_subclasses=True)\nclass SSEParser:"),
]
for name, old, new in edits:
    path = src / name
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, (name, old)
    text = text.replace(old, new)
    if "mypyc_attr" in new:
        text = text.replace("\nfrom proxy.", "\nfrom mypy_extensions import mypyc_attr\nfrom proxy.", 1)
    path.write_text(text, encoding="utf-8")
EOF

start=$(date +%s)
(cd "$work/src" && "$PY" -m pip wheel --quiet --no-deps -w "$work/dist" .)
wheel=$(echo "$work"/dist/*.whl)
echo "wheel built in $(($(date +%s) - start)) s: $(du -k "$wheel" | cut -f1) KiB ($(basename "$wheel"))"
# Its own environment with the wheel; the dependencies come from python3's.
"$PY" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-deps --ignore-installed "$wheel"

count() {  # count pure|compiled SURFACE DETECTOR: "<instructions per event> <compiled modules>"
    local py=("$PY") env=(env "PYTHONPATH=$PWD") extra=()
    if [ "$1" = compiled ]; then
        py=("$work/venv/bin/python") env=(env -u PYTHONPATH) extra=(--installed)
    fi
    "${env[@]}" valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \
        "${py[@]}" bench/measure/relay/relay_work.py --callgrind --streams "$streams" --reps "$reps" \
        --surface "$2" --detector "$3" "${extra[@]}" 2>&1 | "$PY" -c '
import re, sys
text = sys.stdin.read()
ir = int(re.search(r"Collected : (\d+)", text)[1])
m = re.search(r"events/rep=(\d+) reps=(\d+)", text)
print(round(ir / (int(m[1]) * int(m[2]))), re.search(r"compiled modules: (\d+)", text)[1])'
}

printf '%-12s %-9s %10s %10s %8s\n' surface detector pure compiled change
for surface in chat completions responses messages; do
    for detector in null real; do
        # the two runs side by side (two cores); instruction counts do not depend on it
        count pure "$surface" "$detector" >"$work/pure" &
        count compiled "$surface" "$detector" >"$work/compiled"
        wait
        read -r p pn <"$work/pure"
        read -r c cn <"$work/compiled"
        if [ "$pn" != 0 ] || [ "$cn" = 0 ]; then
            echo "wrong code ran: pure run $pn compiled modules, compiled run $cn" >&2
            exit 1
        fi
        printf '%-12s %-9s %10d %10d %7.1f%%\n' "$surface" "$detector" "$p" "$c" \
            "$("$PY" -c "print(100 * ($c - $p) / $p)")"
    done
done
