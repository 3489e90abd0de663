#!/usr/bin/env bash
# llama.cpp's quantizations of the main job's model, the peers its table
# measures beside mpq's rows (examples/llm/llm_methods.c, --peers):
#
#   bash bench/llama_peers.sh [MODEL [CALIB [DIR]]]
#
# builds llama-imatrix and llama-quantize from the llama-cpp-python source
# package (bench/llama_cpp.sh), computes llama.cpp's importance matrix of
# MODEL on the calibration text (64 chunks of 512 tokens, the windows of
# GPTQ's X^T X; never the evaluation text), and quantizes MODEL to each
# type below with it (--allow-requantize: the model's linear maps are Q4_1,
# so llama.cpp starts from the same dequantized weights as mpq's fp32
# reference). Writes DIR/peer-TYPE.gguf, DIR/TYPE.log and DIR/fallbacks.txt:
# the tensors whose rows are not a multiple of 256 (SmolLM2's inputs of 576)
# cannot hold a k-quant or IQ4_XS, and llama.cpp gives them a type of
# blocks of 32 instead (its tensor_type_fallback). Only the types mpq reads
# (k-quants, IQ4_NL, IQ4_XS, Q4_0 .. Q8_0): the IQ3 and IQ2 types code
# with lattice tables mpq does not carry. Each file is reused while it is
# newer than the importance matrix, which is reused while it is newer than
# MODEL and CALIB. DIR defaults to build/peers.
set -eu
cd "$(dirname "$0")/.."
model=${1:-build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
calib=${2:-build/text/calib.txt}
out=${3:-build/peers}
types="Q2_K Q3_K_S Q3_K_M Q3_K_L IQ4_XS Q4_K_S Q4_K_M Q5_K_M Q6_K"
. bench/llama_cpp.sh
llama_cpp_build llama-imatrix llama-quantize
mkdir -p "$out"
imatrix="$out/imatrix.gguf"
if [ ! -s "$imatrix" ] || [ "$model" -nt "$imatrix" ] || [ "$calib" -nt "$imatrix" ]; then
    echo "llama.cpp's importance matrix of $model on $calib (64 chunks of 512)"
    # --no-repack: the repacked CPU path uses instructions some virtual machines
    # advertise but do not allow (AMX); the matrix is the same
    "$llama_bin/llama-imatrix" -m "$model" -f "$calib" -o "$imatrix" -c 512 --chunks 64 -t "$(nproc)" \
        --no-repack >"$out/imatrix.log" 2>&1 || { tail -5 "$out/imatrix.log" >&2; exit 1; }
fi
: >"$out/fallbacks.txt.tmp"
for t in $types; do
    f="$out/peer-$t.gguf"
    if [ ! -s "$f" ] || [ "$imatrix" -nt "$f" ]; then
        echo "llama-quantize --imatrix $t"
        "$llama_bin/llama-quantize" --allow-requantize --imatrix "$imatrix" "$model" "$f.tmp" "$t" \
            >"$out/$t.log" 2>&1 || { tail -5 "$out/$t.log" >&2; exit 1; }
        mv "$f.tmp" "$f"
    fi
    # "blk.N.NAME.weight - ncols 576 not divisible by 256 (required for type q3_K) -> falling back to q4_0"
    # per type: how many tensors of each name fell back, and to what
    sed -n 's/^.*blk\.[0-9]*\.\([a-z_]*\)\.weight.*type *\([A-Za-z0-9_]*\)).*falling back to *\([A-Za-z0-9_]*\).*/\1 \2 -> \3/p' \
        "$out/$t.log" | sort | uniq -c | awk -v t="$t" '{ printf "%s: %d x %s %s %s %s\n", t, $1, $2, $3, $4, $5 }' \
        >>"$out/fallbacks.txt.tmp"
done
mv "$out/fallbacks.txt.tmp" "$out/fallbacks.txt"
echo "peers in $out: $(cd "$out" && ls peer-*.gguf | tr '\n' ' ')"
