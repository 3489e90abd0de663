#!/usr/bin/env bash
# The README's "Using the header" program, as a new user takes it: the C
# block copied verbatim into quickstart.c beside a copy of mpq.h, built and
# run with the commands of the shell block that follows it (any warning is
# an error here). The block must also be examples/quickstart.c, so that the
# two cannot drift apart.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/readme}
rm -rf "$dir" && mkdir -p "$dir"
awk '/^## Using the header/ { s = 1 } s == 1 && /^```c$/ { s = 2; next } s == 2 && /^```$/ { exit } s == 2' \
    "$root/README.md" >"$dir/quickstart.c"
awk '/^## Using the header/ { s = 1 } s == 1 && /^```c$/ { s = 2 } s == 2 && /^```sh$/ { s = 3; next }
     s == 3 && /^```$/ { exit } s == 3' "$root/README.md" >"$dir/commands.sh"
cmp "$dir/quickstart.c" "$root/examples/quickstart.c"
grep -q '^cc .* -lm$' "$dir/commands.sh"
cp "$root/mpq.h" "$dir/"
cd "$dir"
bash -c "$(sed 's/^cc /cc -Werror /' commands.sh)" | tee out.txt
grep -Eq '^256 x 1024 at 3\.25 bits per weight \([0-9]+ bytes\), path [a-z0-9-]+: relative error 0\.[0-9]+$' out.txt
