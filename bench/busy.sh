#!/usr/bin/env bash
# Runs a command while N other processes keep cores busy (a shared machine,
# a build beside an inference engine), then stops them.
#   bash bench/busy.sh N COMMAND [ARGS...]
# Example: how decode speed holds up with two busy loops on a 2-core machine
#   bash bench/busy.sh 2 build/release/mpq speed -p 0 -n 64 --threads 2 MODEL
set -u
if [ $# -lt 2 ] || ! [ "$1" -ge 0 ] 2>/dev/null; then
    echo "usage: bash bench/busy.sh N COMMAND [ARGS...]" >&2
    exit 2
fi
n=$1
shift
pids=()
for ((k = 0; k < n; k++)); do
    (while :; do :; done) &
    pids+=($!)
done
stop() { [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null; }
trap stop EXIT INT TERM
sleep 0.5 # let the scheduler spread them
"$@"
