#!/usr/bin/env bash
# mpq as a user outside the repository gets it: (1) `meson install` into a
# staging prefix, then test/consumer/consumer.c built with the compiler and
# pkg-config alone and run; (2) the same program as a meson project with mpq
# as a subproject (dependency('mpq', fallback: ...)).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build/install-check}
rm -rf "$work" && mkdir -p "$work" && work=$(cd "$work" && pwd) # meson wants an absolute prefix
meson setup "$work/build" "$root" --prefix="$work/stage" -Dlibdir=lib -Dtests=false -Dexamples=false \
    -Dbenches=false -Dcuda=disabled -Dio=enabled >"$work/setup.log"
meson install -C "$work/build" >"$work/install.log"
for f in include/mpq/mpq.h include/mpq/mpq_io.h lib/libmpq_io.a lib/pkgconfig/mpq.pc bin/mpq; do
    [ -e "$work/stage/$f" ] || { echo "not installed: $f"; exit 1; }
done
export PKG_CONFIG_PATH=$work/stage/lib/pkgconfig
# shellcheck disable=SC2046
cc -std=c11 -O2 -Wall -Wextra -Werror "$root/test/consumer/consumer.c" -o "$work/consumer" \
    $(pkg-config --cflags --libs mpq)
"$work/consumer" "$work/installed.safetensors"
# the subproject: a copy of the project beside the repository's files, mpq under subprojects/
mkdir -p "$work/sub/subprojects"
cp "$root/test/consumer/meson.build" "$root/test/consumer/consumer.c" "$work/sub/"
ln -s "$root" "$work/sub/subprojects/mpq"
meson setup "$work/sub/build" "$work/sub" >"$work/sub-setup.log"
ninja -C "$work/sub/build" >"$work/sub-ninja.log"
"$work/sub/build/consumer" "$work/subproject.safetensors"
