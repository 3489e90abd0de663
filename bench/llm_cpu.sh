#!/usr/bin/env bash
# Whole-model CPU speed and quality, mpq against llama.cpp in one run:
#   - perplexity of SmolLM2-135M-Instruct's GGUF as it is (its linear maps
#     Q4_1): llama-perplexity and `mpq eval` on the same text, context 512,
#     every chunk (--ppl-chunks N: the first N only); then llama.cpp's Q4_0
#     against mpq's RTN 4-bit at groups of 128 and 32 on the first 8 chunks;
#   - prompt (128 tokens) and decode (64 tokens) speed, llama-bench's way:
#     llama.cpp on the GGUF as it is (Q4_1) and requantized to Q4_0
#     (llama-quantize; the K-quants need rows of 256 and fall back to Q4_0 on
#     SmolLM2's 576) against mpq on the same GGUF quantized by `mpq quantize`
#     to 4.25 and 3.25 bpw (RTN 4 and 3 bits, group 128; the embedding, which
#     is the head, at 8 bits as llama.cpp keeps it at Q8_0), and the 4.25 file
#     read with one and two planes skipped (3.25 and 2.25 bpw read, as PMPD
#     decodes);
#   - the same speeds on a random model of Llama-3-8B's layers (dim 4096, ffn
#     14336, 32/8 heads; --big-layers of its 32 layers, default 4, so that
#     mpq's float32 copy of it fits in memory; vocabulary 32000, untied head):
#     bench_random_llm writes it as a Hugging Face checkpoint in F16,
#     bench/hf_to_gguf.py as an F16 GGUF, llama-quantize makes Q4_0 and Q4_1
#     of it (its head Q6_K, llama-quantize's choice), and mpq quantizes the
#     checkpoint to 4.25 and 3.25 bpw with the head at 6 bits (--embed-bits 6).
# --isa avx2 runs both on the instructions of an AVX2 machine: llama.cpp
# built with GGML_NATIVE=OFF (bench/llama_cpp.sh) and mpq built with
# -Dnative=false -Dsimd=avx2 (build/release-avx2), its products on the
# avx2-int kernels (--cpu-path). The runs alternate (llama.cpp, mpq,
# llama.cpp, ...) --rounds times so that the machine's drift shows in both.
# llama.cpp comes from the llama-cpp-python source package on PyPI, built
# once with CMake outside the repository (MPQ_LLAMA_DIR, default
# ~/.cache/mpq-llama.cpp).
#
#   bash bench/llm_cpu.sh [--threads T] [--rounds R] [--ppl-chunks N] [--isa native|avx2]
#                         [--big-layers N] [--out FILE]
#
# --ppl-chunks -1 skips the perplexity part, --big-layers 0 the 8B-shaped
# model. Writes the raw output to FILE (default
# bench/results/cpu-llm[-avx2]-DATE.txt).
set -eu
cd "$(dirname "$0")/.."
threads=2 rounds=3 ppl_chunks=0 out="" isa=native big=4
usage="usage: bash bench/llm_cpu.sh [--threads T] [--rounds R] [--ppl-chunks N] [--isa native|avx2] [--big-layers N] [--out FILE]"
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ppl-chunks) ppl_chunks=$2; shift 2 ;;
    --isa) isa=$2; shift 2 ;;
    --big-layers) big=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 1 ;;
    esac
done
case "$isa" in
native) suffix="" mbuild=build/release margs=() path=auto ;;
avx2) suffix=-avx2 mbuild=build/release-avx2 margs=(-Dnative=false -Dsimd=avx2) path=avx2-int ;;
*) echo "$usage" >&2; exit 1 ;;
esac
[ -n "$out" ] || out=bench/results/cpu-llm$suffix-$(date +%F).txt
llama_isa=$isa
source bench/llama_cpp.sh
version=$llama_version

bash examples/fetch.sh
gguf=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
text=build/text/eval.txt
[ -x build/release/mpq ] || meson setup build/release --buildtype=release -Dio=enabled >/dev/null
ninja -C build/release mpq bench_random_llm >/dev/null
[ -x "$mbuild/mpq" ] || meson setup "$mbuild" --buildtype=release -Dio=enabled "${margs[@]}" >/dev/null
ninja -C "$mbuild" mpq >/dev/null
mpq="$mbuild/mpq"

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

# The 8B-shaped model: checkpoint, GGUF, llama.cpp's and mpq's quantizations (each made once).
if [ "$big" -gt 0 ]; then
    bd=build/bench/llama3-8b-shape-L$big
    if [ ! -f "$bd/hf/model.safetensors" ]; then
        mkdir -p "$bd"
        build/release/bench_random_llm --dim 4096 --ffn 14336 --heads 32 --kv-heads 8 --layers "$big" \
            --vocab 32000 "$bd/hf" >/dev/null
    fi
    [ -x build/venv/bin/python ] || python3 -m venv build/venv
    build/venv/bin/python -c 'import gguf, numpy' 2>/dev/null ||
        build/venv/bin/pip install -q --disable-pip-version-check 'gguf==0.19.0' numpy
    [ -f "$bd/f16.gguf" ] || build/venv/bin/python bench/hf_to_gguf.py "$bd/hf" "$bd/f16.gguf"
    for t in Q4_0 Q4_1; do
        [ -f "$bd/$t.gguf" ] || "$bin/llama-quantize" "$bd/f16.gguf" "$bd/$t.gguf" "$t" >"$bd/$t.log" 2>&1
    done
    for b in 4 3; do
        [ -f "$bd/rtn$b.safetensors" ] ||
            build/release/mpq quantize --quiet --bits "$b" --embed-bits 6 "$bd/hf" "$bd/rtn$b.safetensors"
    done
fi

# speed NAME FILE [mpq options]: one llama-bench or mpq speed row
lbench() { "$bin/llama-bench" -m "$2" -p 128 -n 64 -t "$threads" -o md 2>/dev/null | grep -E '^\| llama' |
    sed "s|^|$1: |"; }
mbench() {
    local name=$1 file=$2
    shift 2
    echo "$name: $("$mpq" speed --threads "$threads" --cpu-path "$path" "$@" "$file" 2>&1 | grep -E 'pp128|tg64' |
        awk -F'|' '{ printf "%s %s  ", $6, $7 }')"
}

{
    echo "# bench/llm_cpu.sh --threads $threads --rounds $rounds --ppl-chunks $ppl_chunks --isa $isa" \
        "--big-layers $big, $(date -u +%FT%TZ)"
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
        "flags: $(grep -m1 -o -w -E 'avx512vbmi|avx512_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "# llama.cpp: llama-cpp-python $version (vendor/llama.cpp), GGML_NATIVE=$llama_native ${llama_cflags:-}," \
        "$("$bin/llama-bench" --version 2>&1 | head -1)"
    echo "# mpq: $mbuild, --cpu-path $path; model: $gguf; text: $text ($(cat build/text/VERSION))"
    if [ "$ppl_chunks" -ge 0 ]; then
        echo
        echo "## perplexity of the GGUF as it is, context 512"
        pc=()
        [ "$ppl_chunks" -gt 0 ] && pc=(--chunks "$ppl_chunks")
        "$bin/llama-perplexity" -m "$gguf" -f "$text" -c 512 -t "$threads" "${pc[@]}" 2>&1 |
            grep -E 'Final estimate|^\[' | tail -2
        "$mpq" eval --quiet --threads "$threads" --cpu-path "$path" "${pc[@]}" "$gguf" "$text"
        echo
        echo "## perplexity at 4 bits, first 8 chunks: llama.cpp Q4_0, mpq RTN 4-bit g128 and g32"
        "$bin/llama-perplexity" -m "$q40" -f "$text" -c 512 -t "$threads" --chunks 8 2>&1 | grep -E 'Final estimate'
        for f in "$m4" "$m4g32"; do
            echo "$f: $("$mpq" eval --quiet --threads "$threads" --cpu-path "$path" --chunks 8 "$f" "$text")"
        done
    fi
    echo
    echo "## speed: llama-bench -p 128 -n 64 -t $threads and mpq speed -p 128 -n 64 (tokens/s: pp128, tg64)"
    for r in $(seq "$rounds"); do
        echo "### round $r, SmolLM2-135M"
        lbench "llama.cpp Q4_0" "$q40"
        mbench "mpq 4.25 bpw" "$m4"
        lbench "llama.cpp Q4_1" "$gguf"
        mbench "mpq 3.25 bpw" "$m3"
        mbench "mpq 4.25 bpw, 1 plane skipped (3.25 read)" "$m4" --skip-planes 1
        mbench "mpq 4.25 bpw, 2 planes skipped (2.25 read)" "$m4" --skip-planes 2
        if [ "$big" -gt 0 ]; then
            echo "### round $r, Llama-3-8B shape, $big layers"
            lbench "llama.cpp Q4_0" "$bd/Q4_0.gguf"
            mbench "mpq 4.25 bpw" "$bd/rtn4.safetensors"
            lbench "llama.cpp Q4_1" "$bd/Q4_1.gguf"
            mbench "mpq 3.25 bpw" "$bd/rtn3.safetensors"
            mbench "mpq 4.25 bpw, 1 plane skipped (3.25 read)" "$bd/rtn4.safetensors" --skip-planes 1
        fi
    done
    if [ "$big" -gt 0 ]; then
        echo
        echo "## sizes of the 8B-shaped model's files (bytes)"
        for f in "$bd/Q4_0.gguf" "$bd/Q4_1.gguf" "$bd/rtn4.safetensors" "$bd/rtn3.safetensors"; do
            echo "$f $(stat -c %s "$f")"
        done
    fi
} | tee "$out"
echo "wrote $out"
