#!/usr/bin/env bash
# Tables are quoted from one place each, and the quotes must not drift: the
# results table in examples/llm/README.md and in examples/tinylm/README.md
# (the first table whose header starts "| method") is the table at the top
# of the results.md beside it (the copy of the last run's output).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/quote-check}
mkdir -p "$dir"
for ex in llm tinylm; do
    awk '/^\| method/ { s = 1 } s && !/^\| / { exit } s' "$root/examples/$ex/README.md" >"$dir/$ex-readme.txt"
    awk '/^\| / { s = 1 } s && !/^\| / { exit } s' "$root/examples/$ex/results.md" >"$dir/$ex-results.txt"
    [ "$(wc -l <"$dir/$ex-readme.txt")" -gt 10 ] || { echo "examples/$ex/README.md: no results table"; exit 1; }
    diff "$dir/$ex-results.txt" "$dir/$ex-readme.txt"
    echo "examples/$ex/README.md quotes results.md: $(wc -l <"$dir/$ex-readme.txt") lines"
done
