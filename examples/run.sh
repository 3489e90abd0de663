#!/usr/bin/env bash
# The main job. Installs what it needs (Debian packages, when missing),
# fetches SmolLM2-135M-Instruct and the Python documentation into build/
# (examples/fetch.sh), builds mpq in release mode, gathers the statistics
# of every method once with `mpq calibrate` (build/llm/stats.safetensors,
# about 13 minutes on 2 cores, and GPTQ's X^T X over 64 windows in
# build/llm/hessian.safetensors, about 10 minutes, and the Fisher of the
# rotated weights in build/llm/stats_rot.safetensors, about 5 minutes, and
# every linear map's KL divergence under GPTQ at 2, 3, 4 and 6 bits for the
# auto rows in build/llm/measure.safetensors and (groups of 256)
# build/llm/measure-g256.safetensors, about 8 minutes each; each
# reused until the model or the calibration text changes), makes llama.cpp's
# quantizations of the same model (bench/llama_peers.sh: llama.cpp built
# once from PyPI's llama-cpp-python sources, about 15 minutes) and runs
# llm_methods: every
# method of the library on the real model - quantization, perplexity as
# llama.cpp computes it, bits per weight and decode tokens per second -
# printing the table and writing build/llm/results.md and
# build/llm/ppl_vs_bpw.svg.
#
#   bash examples/run.sh [llm_methods options]  the main job (--help; --full: every
#                                               evaluation chunk, about two hours)
#   bash examples/run.sh tinylm [options]       every method on the small trained
#                                               transformer (examples/tinylm)
#   bash examples/run.sh demo [options]         the single-layer demo on a
#                                               synthetic 4096 x 4096 layer
set -eu
cd "$(dirname "$0")/.."
. util/need.sh
need_debs meson ninja-build pkg-config gcc g++ cmake libcjson-dev libstb-dev python3 python3-venv
[ -d build/demo ] || meson setup build/demo --buildtype=release -Dtests=false -Dbenches=false >/dev/null
# a build directory configured before cJSON was installed lacks the model targets
ninja -C build/demo mpq >/dev/null 2>&1 ||
    { meson setup --reconfigure build/demo -Dio=enabled >/dev/null && ninja -C build/demo mpq >/dev/null; }
case "${1:-}" in
demo)
    shift
    ninja -C build/demo demo >/dev/null
    exec build/demo/demo "$@"
    ;;
tinylm)
    shift
    ninja -C build/demo tinylm >/dev/null
    exec build/demo/tinylm "$@"
    ;;
esac
bash examples/fetch.sh
ninja -C build/demo llm_methods >/dev/null
model=build/models/SmolLM2-135M-Instruct.Q4_1.gguf calib=build/text/calib.txt stats=build/llm/stats.safetensors
hessian=build/llm/hessian.safetensors rot_stats=build/llm/stats_rot.safetensors measure=build/llm/measure.safetensors
measure256=build/llm/measure-g256.safetensors
mkdir -p build/llm
if [ ! -s "$stats" ] || [ "$model" -nt "$stats" ] || [ "$calib" -nt "$stats" ]; then
    echo "statistics: mpq calibrate $model $calib -o $stats (once; reused until the model or the text changes)"
    build/demo/mpq calibrate "$model" "$calib" -o "$stats"
fi
if [ ! -s "$hessian" ] || [ "$model" -nt "$hessian" ] || [ "$calib" -nt "$hessian" ]; then
    echo "GPTQ's X^T X: mpq calibrate --stats xtx --windows 64 $model $calib -o $hessian (once, likewise)"
    build/demo/mpq calibrate --stats xtx --windows 64 "$model" "$calib" -o "$hessian"
fi
if [ ! -s "$rot_stats" ] || [ "$model" -nt "$rot_stats" ] || [ "$calib" -nt "$rot_stats" ]; then
    echo "the rotated weights' Fisher: mpq calibrate --rotate 1 --stats fisher $model $calib -o $rot_stats (once, likewise)"
    build/demo/mpq calibrate --rotate 1 --stats fisher "$model" "$calib" -o "$rot_stats"
fi
# the options of examples/llm/rows.h's LLM_MEASURE_ARGS (llm_methods refuses a file measured otherwise), at
# groups of 128 and of 256
for g in 128 256; do
    case " $* " in *" --quick "*) break ;; esac # no auto rows in the quick run
    out=$measure
    [ "$g" = 256 ] && out=$measure256
    if [ ! -s "$out" ] || [ "$hessian" -nt "$out" ]; then
        echo "the maps' KL divergences: mpq measure --method gptq --act-order --widths 2,3,4,6 --group $g --hessian $hessian $model $calib -o $out (once, likewise)"
        build/demo/mpq measure --method gptq --act-order --widths 2,3,4,6 --group "$g" --hessian "$hessian" "$model" "$calib" -o "$out"
    fi
done
# llama.cpp's quantizations of the same model with its importance matrix (once; built from PyPI's
# llama-cpp-python sources outside the repository), measured beside the rows
case " $* " in
*" --quick "*) ;; # no peer rows in the quick run
*) bash bench/llama_peers.sh "$model" "$calib" build/peers ;;
esac
exec build/demo/llm_methods --stats "$stats" --hessian "$hessian" --rot-stats "$rot_stats" --measure "$measure" --measure256 "$measure256" --peers build/peers "$@"
