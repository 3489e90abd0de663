#!/usr/bin/env bash
# Everything the CUDA backend needs checked and timed on a machine with a GPU,
# in one go: the kernels against the CPU reference (cuda_check), the same
# with the wgmma kernel on every batch from 16 (cuda_check_wg16: sm_90a
# machine code alone, for an H100 or H200), the same
# built with compute_80 PTX alone (cuda_check_ptx80: the driver compiles it
# for the GPU at hand, so the code paths of sm_80 run on a newer card), the
# small cases under compute-sanitizer memcheck, racecheck and synccheck
# (synccheck tracking up to 100000 mbarriers: with its default it stopped
# cluster_probe's bulk copies with a launch failure), test/gpu/cluster_probe.cu plain
# and under racecheck, the benchmark (BENCH_ARGS) and PyTorch's products beside it
# (bench/torch_peers.py, TORCH_ARGS; TORCH=0 leaves them out), and with
# LLM=1 bench/llm_cuda.sh. Build here first (bash test/gpu/run_device.sh
# build; GPU_ARCHS, a comma list, replaces meson's gpu_archs for the main
# build), then run it where the GPU is (bash test/gpu/run_device.sh run
# [OUTDIR]), with .gpu beside it. CHECK=0, PTX80=0 or SAN=0 leave out
# cuda_check (and cuda_check_wg16), its compute_80 build or the sanitizers.
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
            -Dexamples=false ${GPU_ARCHS:+-Dgpu_archs=$GPU_ARCHS} >"$bin/setup.log" 2>&1 &&
        ninja -C "$bin/build" cuda_check cluster_probe bench_gemv_cuda mpq bench_random_llm >"$bin/ninja.log" 2>&1 &&
        cp "$bin/build/cuda_check" "$bin/build/cluster_probe" "$bin/build/bench_gemv_cuda" "$bin/build/mpq" \
            "$bin/build/bench_random_llm" "$bin/" &&
        rm -rf "$bin/build" &&
        meson setup "$bin/build80" --buildtype=release -Dnative=false -Dcuda=enabled -Dtests=true -Dbenches=false \
            -Dexamples=false -Dio=disabled -Dgpu_archs=compute_80 >"$bin/setup80.log" 2>&1 &&
        ninja -C "$bin/build80" cuda_check >"$bin/ninja80.log" 2>&1 &&
        cp "$bin/build80/cuda_check" "$bin/cuda_check_ptx80" && rm -rf "$bin/build80" &&
        # the wgmma kernel on every batch from 16 (sm_90a only)
        nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DMPQ_CUDA_WG_BATCH=16 -DMPQ_CUDA_WG_MAX=100000 \
            -I. -Iutil -Xcompiler -fopenmp test/gpu/cuda_check.c mpq_cuda.cu -o "$bin/cuda_check_wg16" \
            -lcublas -lm -lgomp >"$bin/nvcc_wg16.log" 2>&1 &&
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
    for v in cuda_check cuda_check_wg16 cuda_check_ptx80; do
        [ "$v" != cuda_check_ptx80 ] && [ "${CHECK:-1}" = 0 ] && continue
        [ "$v" = cuda_check_ptx80 ] && [ "${PTX80:-1}" = 0 ] && continue
        t0=$(date +%s)
        "$bin/$v" >"$out/$v.txt" 2>&1 || rc=1
        echo "$v ($(($(date +%s) - t0)) s):"; grep -E "^not ok|^# " "$out/$v.txt" | head -n 40; tail -n 1 "$out/$v.txt"
    done
    for tool in memcheck racecheck synccheck; do
        [ "${SAN:-1}" = 0 ] && break
        opt=()
        [ $tool = synccheck ] && opt=(--num-cuda-barriers 100000)
        compute-sanitizer --tool $tool "${opt[@]}" --error-exitcode 9 "$bin/cuda_check" --quick >"$out/$tool.txt" 2>&1 ||
            rc=1
        echo "$tool: $(grep -cE '^ok' "$out/$tool.txt") ok, $(grep -cE '^not ok' "$out/$tool.txt") not ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.txt" | tail -n 1)"
    done
    # the probe's cases, plain and under racecheck: what the tool says on the pattern alone
    if [ "${SAN:-1}" = 1 ]; then
        "$bin/cluster_probe" >"$out/cluster_probe.txt" 2>&1 || rc=1
        compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/cluster_probe" >"$out/cluster_racecheck.txt" 2>&1 ||
            rc=1
        echo "cluster_probe: $(grep -c '^ok' "$out/cluster_probe.txt") ok; racecheck: $(grep 'RACECHECK SUMMARY' "$out/cluster_racecheck.txt")"
    fi
    "$bin/bench_gemv_cuda" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt"
    # PyTorch's int4, fp8 and fp16 products in the same call, where python3 has torch
    if [ "${TORCH:-1}" = 1 ] && python3 -c 'import torch' 2>/dev/null; then
        python3 bench/torch_peers.py ${TORCH_ARGS:-} 2>&1 | tee "$out/torch.txt"
    fi
    if [ "${LLM:-0}" = 1 ]; then bash bench/llm_cuda.sh "$bin" /tmp/mpq-llm 2>&1 | tee "$out/llm.txt" || rc=1; fi
    exit $rc
    ;;
esac
