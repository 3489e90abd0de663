#!/usr/bin/env bash
# SmolLM2-135M-Instruct on this CPU, mpq against llama.cpp in one run:
#   - perplexity of the GGUF as it is (its linear maps Q4_1): llama-perplexity
#     and `mpq eval` on the same text, context 512, every chunk (--ppl-chunks N:
#     the first N only); then llama.cpp's Q4_0 against mpq's RTN 4-bit at
#     groups of 128 and 32 on the first 8 chunks;
#   - prompt (128 tokens) and decode (64 tokens) speed, llama-bench's way:
#     llama.cpp on the GGUF requantized to Q4_0 (llama-quantize; the K-quants
#     need rows of 256 and fall back to Q4_0 on SmolLM2's 576) against mpq on
#     the same GGUF quantized by `mpq quantize` to 4.25 and 3.25 bpw (RTN 4
#     and 3 bits, group 128; the embedding, which is the head, at 8 bits as
#     llama.cpp keeps it at Q8_0), and the 4.25 file read with one plane
#     skipped (3.25 bpw read, as PMPD decodes).
# The runs alternate (llama.cpp, mpq, llama.cpp, ...) --rounds times so that
# the machine's drift shows in both. llama.cpp comes from the llama-cpp-python
# source package on PyPI, built once with CMake outside the repository
# (bench/llama_cpp.sh; MPQ_LLAMA_DIR, default ~/.cache/mpq-llama.cpp).
#
#   bash bench/llm_cpu.sh [--threads T] [--rounds R] [--ppl-chunks N] [--out FILE]
#
# Writes the raw output to FILE (default bench/results/cpu-llm-DATE.txt).
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
threads=2 rounds=3 ppl_chunks=0 out=""
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ppl-chunks) ppl_chunks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: bash bench/llm_cpu.sh [--threads T] [--rounds R] [--ppl-chunks N] [--out FILE]" >&2; exit 1 ;;
    esac
done
[ -n "$out" ] || out=bench/results/cpu-llm-$(date +%F).txt
source bench/llama_cpp.sh
version=$llama_version

bash examples/fetch.sh
gguf=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
text=build/text/eval.txt
if [ ! -x build/release/mpq ]; then
    meson setup build/release --buildtype=release -Dio=enabled >/dev/null
fi
ninja -C build/release mpq >/dev/null

llama_cpp_build llama-bench llama-perplexity llama-quantize
bin=$llama_bin

mkdir -p build/bench
q40=build/bench/SmolLM2-135M-Instruct.Q4_0.gguf
[ -f "$q40" ] || "$bin/llama-quantize" --allow-requantize "$gguf" "$q40" Q4_0 >build/bench/quantize.log 2>&1
m4=build/bench/smollm2-rtn4.safetensors m3=build/bench/smollm2-rtn3.safetensors
m4g32=build/bench/smollm2-rtn4-g32.safetensors
[ -f "$m4" ] || build/release/mpq quantize --quiet --bits 4 --embed-bits 8 "$gguf" "$m4"
[ -f "$m3" ] || build/release/mpq quantize --quiet --bits 3 --embed-bits 8 "$gguf" "$m3"
[ -f "$m4g32" ] || build/release/mpq quantize --quiet --bits 4 --group 32 --embed-bits 8 "$gguf" "$m4g32"

{
    echo "# bench/llm_cpu.sh --threads $threads --rounds $rounds --ppl-chunks $ppl_chunks, $(date -u +%FT%TZ)"
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
        "flags: $(grep -m1 -o -w -E 'avx512vbmi|avx512_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "# llama.cpp: llama-cpp-python $version (vendor/llama.cpp), $("$bin/llama-bench" --version 2>&1 | head -1)"
    echo "# model: $gguf; text: $text ($(cat build/text/VERSION))"
    echo
    echo "## perplexity of the GGUF as it is, context 512"
    pc=()
    [ "$ppl_chunks" -gt 0 ] && pc=(--chunks "$ppl_chunks")
    "$bin/llama-perplexity" -m "$gguf" -f "$text" -c 512 -t "$threads" "${pc[@]}" 2>&1 | grep -E 'Final estimate|^\[' | tail -2
    build/release/mpq eval --quiet --threads "$threads" "${pc[@]}" "$gguf" "$text"
    echo
    echo "## perplexity at 4 bits, first 8 chunks: llama.cpp Q4_0, mpq RTN 4-bit g128 and g32"
    "$bin/llama-perplexity" -m "$q40" -f "$text" -c 512 -t "$threads" --chunks 8 2>&1 | grep -E 'Final estimate'
    for f in "$m4" "$m4g32"; do
        echo "$f: $(build/release/mpq eval --quiet --threads "$threads" --chunks 8 "$f" "$text")"
    done
    echo
    echo "## speed: llama-bench -p 128 -n 64 -t $threads (Q4_0) and mpq speed -p 128 -n 64 (mpq files)"
    for r in $(seq "$rounds"); do
        echo "### round $r"
        "$bin/llama-bench" -m "$q40" -p 128 -n 64 -t "$threads" -o md 2>/dev/null | grep -E '^\| (llama|model)'
        echo "mpq 4.25 bpw: $(build/release/mpq speed --threads "$threads" "$m4" 2>&1 | tr '\n' ' ')"
        echo "mpq 3.25 bpw: $(build/release/mpq speed --threads "$threads" "$m3" 2>&1 | tr '\n' ' ')"
        for k in 1 2; do
            echo "mpq 4.25 bpw, $k plane(s) skipped ($((4 - k)).25 read): $(build/release/mpq speed \
                --threads "$threads" --skip-planes "$k" "$m4" 2>&1 | tr '\n' ' ')"
        done
    done
} | tee "$out"
echo "wrote $out"
