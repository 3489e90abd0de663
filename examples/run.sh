#!/usr/bin/env bash
# Installs what the demo needs (Debian packages, when missing), builds mpq in
# release mode and runs the demo on its embedded default input (a synthetic
# LLM-like 4096 x 4096 layer). Extra arguments go to the demo (--help).
set -eu
cd "$(dirname "$0")/.."
need=()
for p in meson ninja-build pkg-config gcc g++; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -d build/demo ] || meson setup build/demo --buildtype=release -Dtests=false -Dbenches=false >/dev/null
ninja -C build/demo demo >/dev/null
exec build/demo/demo "$@"
