#!/usr/bin/env bash
# PMPD on SmolLM2-135M-Instruct: the learned scheduler (section 4.2, appendix
# A.1) against the static one (section 4.3) and fixed precisions, on prompts
# of the evaluation text that neither scheduler saw:
#   - the model: AWQ 5-bit, groups of 128 (`mpq quantize --method awq --bits
#     5`, AWQ's statistics from build/llm/stats.safetensors, which `mpq
#     calibrate` writes when it is missing); 5 bits is the high precision, one
#     bit plane skipped (4 bits) the low one; the prompt always at 5 bits
#     (phase-aware allocation, section 4.1);
#   - the static scheduler: `mpq schedule` on the calibration text, chunks of
#     256 tokens (the second half scored), 5 candidate switch points, at most
#     --max-increase above 5 bits throughout;
#   - the learned scheduler: `mpq schedule --learned` on --windows windows of
#     256 tokens of the calibration text, each labelled by the same
#     criterion, the layer (0, 10, 20 or 29) and the weight decay chosen by
#     cross-validation; and once more with a fixed small weight decay (0.001,
#     500 steps, the cache of the last layer), the network that fits its
#     training windows;
#   - `mpq gen-eval` on --prompts prompts of 128 tokens of the evaluation
#     text, 128 tokens generated greedily under: all 5-bit, all 4-bit after
#     the prompt, the static schedule, the two learned ones; the continuations
#     scored by the GGUF's float weights, and the text's own continuation
#     teacher-forced under each prompt's schedule.
#
#   bash bench/pmpd_learned.sh [--windows N] [--prompts N] [--max-increase X] [--threads T] [--out FILE]
#
# Writes the raw output to FILE (default bench/results/cpu-pmpd-learned-DATE.txt).
set -eu
cd "$(dirname "$0")/.."
windows=192 prompts=32 max_increase=0.1 threads=2 out=""
while [ $# -gt 0 ]; do
    case "$1" in
    --windows) windows=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --max-increase) max_increase=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: bash bench/pmpd_learned.sh [--windows N] [--prompts N] [--max-increase X] [--threads T] [--out FILE]" >&2
       exit 1 ;;
    esac
done
[ -n "$out" ] || out=bench/results/cpu-pmpd-learned-$(date +%F).txt

bash examples/fetch.sh
gguf=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
calib=build/text/calib.txt
eval_text=build/text/eval.txt
if [ ! -x build/release/mpq ]; then
    meson setup build/release --buildtype=release -Dio=enabled >/dev/null
fi
ninja -C build/release mpq >/dev/null
mpq="build/release/mpq"
mkdir -p build/llm build/pmpd
stats=build/llm/stats.safetensors
[ -f "$stats" ] || $mpq calibrate --threads "$threads" "$gguf" "$calib" -o "$stats"

model=build/pmpd/awq5.safetensors
{
    echo "# bash bench/pmpd_learned.sh --windows $windows --prompts $prompts --max-increase $max_increase --threads $threads"
    echo "# $(date -u +%FT%TZ); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    echo
    start=$(date +%s)
    $mpq quantize --quiet --threads "$threads" --method awq --bits 5 --stats "$stats" --embed-bits 8 "$gguf" "$model"
    echo "\$ mpq eval --chunks 8 (5 bits; one plane skipped)"
    $mpq eval --quiet --threads "$threads" --chunks 8 "$model" "$eval_text"
    $mpq eval --quiet --threads "$threads" --chunks 8 --skip-planes 1 "$model" "$eval_text"
    echo
    echo "\$ mpq schedule --levels 0,1 --ctx 256 --chunks 16 --max-increase $max_increase"
    $mpq schedule --quiet --threads "$threads" --levels 0,1 --ctx 256 --chunks 16 --max-increase "$max_increase" \
        "$model" "$calib" -o build/pmpd/static.txt
    echo
    echo "\$ mpq schedule --learned --levels 0,1 --ctx 256 --windows $windows --layer 0,10,20,29 --max-increase $max_increase"
    $mpq schedule --learned --quiet --threads "$threads" --levels 0,1 --ctx 256 --windows "$windows" \
        --layer 0,10,20,29 --max-increase "$max_increase" "$model" "$calib" -o build/pmpd/learned-cv.safetensors
    echo
    echo "\$ mpq schedule --learned --levels 0,1 --ctx 256 --windows $windows --max-increase $max_increase --l2 0.001 --steps 500"
    $mpq schedule --learned --quiet --threads "$threads" --levels 0,1 --ctx 256 --windows "$windows" \
        --l2 0.001 --steps 500 --max-increase "$max_increase" "$model" "$calib" -o build/pmpd/learned-l2-0.001.safetensors
    echo
    echo "\$ mpq gen-eval --prompts $prompts --prompt-tokens 128 -n 128"
    $mpq gen-eval --quiet --threads "$threads" --prompts "$prompts" --prompt-tokens 128 -n 128 "$model" "$eval_text" \
        --reference "$gguf" --schedule 0:0@0 --schedule 0:1@0 --schedule build/pmpd/static.txt \
        --schedule learned:build/pmpd/learned-cv.safetensors --schedule learned:build/pmpd/learned-l2-0.001.safetensors
    echo
    echo "# $(( $(date +%s) - start )) s in all"
} 2>&1 | tee "$out"
