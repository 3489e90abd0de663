#!/usr/bin/env bash
# End to end on the GPU: a Llama-shaped model with random weights (Llama-3-70B's
# layer shapes, LAYERS of them, a vocabulary of 32000; bench_random_llm), RTN
# 3 bits in groups of 128 (3.25 bpw; the embedding and head at 8 bits), run by
# `mpq speed` and `mpq run` with its packed matrices on the GPU
# (--device cuda) against the same weights dequantized to float16 and
# multiplied by cuBLAS (--device cuda-fp16): a prompt of PROMPT tokens
# (default 2048) in one pass, 64 decoded tokens of one sequence, and 64
# decoded tokens of each of SEQS sequences at once (default "16 64 256", as
# a server batches its users). Only the linear maps run on the GPU:
# activations go to and from the host around each product, and attention,
# norms and the rest run on the CPU, in both runs.
#
#   bash bench/llm_cuda.sh BIN_DIR WORK_DIR [LAYERS]
#
# BIN_DIR holds mpq and bench_random_llm built with CUDA (test/gpu/run_device.sh
# build puts them in .gpu); WORK_DIR gets the model files (about 2 bytes per
# weight, removed at the end). DEVICES (default "cuda cuda-fp16") lists the
# --device values to run; DIM and FFN (default 8192 and 28672) change the
# shape (DEVICES=cpu DIM=1024 FFN=2048 tries the script on a small CPU model).
set -eu
[ $# -ge 2 ] || { echo "usage: bash bench/llm_cuda.sh BIN_DIR WORK_DIR [LAYERS]" >&2; exit 1; }
bin=$1 work=$2 layers=${3:-4} dim=${DIM:-8192} ffn=${FFN:-28672}
mkdir -p "$work"
trap 'rm -rf "$work/random" "$work/r3.safetensors"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) threads"
t0=$(date +%s)
"$bin/bench_random_llm" --layers "$layers" --dim "$dim" --ffn "$ffn" "$work/random"
t1=$(date +%s)
"$bin/mpq" quantize --quiet --method rtn --bits 3 --group 128 --embed-bits 8 "$work/random" "$work/r3.safetensors" | tail -n 1
t2=$(date +%s)
echo "random model written in $((t1 - t0)) s, quantized in $((t2 - t1)) s"
rm -rf "$work/random"
for dev in ${DEVICES:-cuda cuda-fp16}; do
    echo "## --device $dev"
    "$bin/mpq" speed --quiet --device "$dev" -p "${PROMPT:-2048}" -n 64 -r 3 "$work/r3.safetensors"
    for b in ${SEQS:-16 64 256}; do "$bin/mpq" speed --quiet --device "$dev" -p 0 -n 64 -b "$b" -r 3 "$work/r3.safetensors" | tail -n 1; done
    "$bin/mpq" run --device "$dev" -n 64 --prompt "The quick brown fox" "$work/r3.safetensors" 2>&1 >/dev/null |
        grep "prompt:"
done
