#!/usr/bin/env bash
# The main job. Installs what it needs (Debian packages, when missing),
# builds mpq in release mode and runs tinylm: every method of the library on
# a small trained transformer (examples/tinylm/tinylm.safetensors) - its
# statistics, plans, quantization, and held-out perplexity and task accuracy
# for each - printing the table and writing build/tinylm/results.md and
# build/tinylm/ppl_vs_bpw.svg. A few minutes on 2 cores.
#
#   bash examples/run.sh [tinylm options]      the main job (--help)
#   bash examples/run.sh demo [demo options]   the single-layer demo on a
#                                              synthetic 4096 x 4096 layer
set -eu
cd "$(dirname "$0")/.."
need=()
for p in meson ninja-build pkg-config gcc g++ libcjson-dev; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -d build/demo ] || meson setup build/demo --buildtype=release -Dtests=false -Dbenches=false >/dev/null
if [ "${1:-}" = demo ]; then
    shift
    ninja -C build/demo demo >/dev/null
    exec build/demo/demo "$@"
fi
# a build directory configured before cJSON was installed lacks the target
ninja -C build/demo tinylm >/dev/null 2>&1 ||
    { meson setup --reconfigure build/demo -Dio=enabled >/dev/null && ninja -C build/demo tinylm >/dev/null; }
exec build/demo/tinylm "$@"
