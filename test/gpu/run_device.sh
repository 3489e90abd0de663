#!/usr/bin/env bash
# Everything the CUDA backend needs checked and timed on a machine with a GPU,
# in one go: the kernels against the CPU reference (cuda_check), the same
# under compute-sanitizer memcheck and racecheck (small cases), and the
# benchmark (BENCH_ARGS), and with LLM=1 bench/llm_cuda.sh. Build here first
# (bash test/gpu/run_device.sh build), then run it where the GPU is
# (bash test/gpu/run_device.sh run [OUTDIR]), with .gpu beside it.
set -u
cd "$(dirname "$0")/../.."
bin=.gpu
case "${1:-run}" in
build)
    # what the build needs (cuda_check is built with the tests, which need Criterion)
    . util/need.sh
    need_debs meson ninja-build pkg-config gcc g++ libcriterion-dev libstb-dev libcjson-dev || exit 1
    # a portable build (no -march=native: the GPU machine's CPU may differ)
    rm -rf "$bin" && mkdir -p "$bin" &&
        meson setup "$bin/build" --buildtype=release -Dnative=false -Dcuda=enabled -Dtests=true -Dbenches=true \
            -Dexamples=false >"$bin/setup.log" 2>&1 &&
        ninja -C "$bin/build" cuda_check bench_gemv_cuda mpq bench_random_llm >"$bin/ninja.log" 2>&1 &&
        cp "$bin/build/cuda_check" "$bin/build/bench_gemv_cuda" "$bin/build/mpq" "$bin/build/bench_random_llm" "$bin/" &&
        rm -rf "$bin/build" &&
        # the shared libraries of mpq and bench_random_llm that the GPU machine may lack
        mkdir -p "$bin/lib" && for l in libcjson.so.1 libgomp.so.1; do
            cp -L "$(ldd "$bin/mpq" | awk -v l=$l '$1 == l { print $3 }')" "$bin/lib/"
        done ||
        { tail -n 30 "$bin"/*.log; exit 1; }
    ;;
run)
    out=${2:-${OUT:-/tmp}}
    export LD_LIBRARY_PATH=$PWD/$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
    rc=0
    "$bin/cuda_check" >"$out/cuda_check.txt" 2>&1 || rc=1
    grep -E "^not ok|^# " "$out/cuda_check.txt"; tail -n 1 "$out/cuda_check.txt"
    for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 "$bin/cuda_check" --quick >"$out/$tool.txt" 2>&1 || rc=1
        echo "$tool: $(grep -cE '^ok' "$out/$tool.txt") ok, $(grep -cE '^not ok' "$out/$tool.txt") not ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.txt" | tail -n 1)"
    done
    "$bin/bench_gemv_cuda" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt"
    if [ "${LLM:-0}" = 1 ]; then bash bench/llm_cuda.sh "$bin" /tmp/mpq-llm 2>&1 | tee "$out/llm.txt" || rc=1; fi
    exit $rc
    ;;
esac
