#!/usr/bin/env bash
# The README quotes its figures from one place each, and the quotes must not
# drift: the speed figures between the "BEGIN speed figures" and "END speed
# figures" markers are the same lines in README.md and in the summary of
# bench/results/NOTES.md, and the main job's table in README.md is the table
# of examples/llm/results.md (the copy of the last run's output).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/quote-check}
mkdir -p "$dir"
between() { awk '/^<!-- END speed figures -->$/ { s = 0 } s { print } /^<!-- BEGIN speed figures/ { s = 1 }' "$1"; }
between "$root/README.md" >"$dir/readme-speed.txt"
between "$root/bench/results/NOTES.md" >"$dir/notes-speed.txt"
[ "$(wc -l <"$dir/readme-speed.txt")" -gt 20 ] || { echo "README.md: no speed figures between the markers"; exit 1; }
diff "$dir/notes-speed.txt" "$dir/readme-speed.txt"
# the first table of each: README's under "## The main job", results.md's at its top
awk '/^## The main job/ { s = 1 } s == 1 && /^\| / { s = 2 } s == 2 && !/^\| / { exit } s == 2' "$root/README.md" \
    >"$dir/readme-table.txt"
awk '/^\| / { s = 1 } s && !/^\| / { exit } s' "$root/examples/llm/results.md" >"$dir/results-table.txt"
[ "$(wc -l <"$dir/readme-table.txt")" -gt 10 ] || { echo "README.md: no table under \"The main job\""; exit 1; }
diff "$dir/results-table.txt" "$dir/readme-table.txt"
echo "README quotes: speed figures $(wc -l <"$dir/readme-speed.txt") lines, main job table $(wc -l <"$dir/readme-table.txt") lines"
