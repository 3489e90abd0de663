#!/bin/bash
# bench/rotation_ablation.sh: each quantizer at 3 and 4 bits (and 3 bits at
# group 64, 3.5 bpw), with and without the incoherence rotation, on SmolLM2
# and the main job's evaluation text: perplexity and KL divergence to the
# float model over --chunks chunks (default 32), through `mpq quantize` and
# `mpq eval` as a user runs them. Needs what `bash examples/run.sh` made:
# build/models, build/text, build/llm/{stats,hessian}.safetensors, and the
# tool (MPQ, default build/release/mpq).
#   bash bench/rotation_ablation.sh [--chunks N] > bench/results/cpu-rotation-ablation-DATE.txt
set -euo pipefail
cd "$(dirname "$0")/.."
MPQ=${MPQ:-build/release/mpq}
CHUNKS=32
[ "${1:-}" = "--chunks" ] && CHUNKS=$2
MODEL=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=build/text/eval.txt
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "# mpq rotation ablation: $MODEL, $TEXT, $CHUNKS chunks of 512, $(date -u +%F)"
echo "# reference (fp32, the GGUF dequantized):"
"$MPQ" eval "$MODEL" "$TEXT" --chunks "$CHUNKS" --kl-base "$TMP/ref.klb" --quiet | sed 's/^/#   /'
printf '\n| quantizer | bits | group | rotation | bpw (linear maps) | perplexity | KLD | same top |\n|---|---|---|---|---|---|---|---|\n'
row() { # quantizer bits group rotate-args... options
    local q=$1 b=$2 g=$3 rot=$4
    shift 4
    "$MPQ" quantize "$@" --bits "$b" --group "$g" $rot --embed-bits 8 --stats build/llm/stats.safetensors \
        --hessian build/llm/hessian.safetensors "$MODEL" "$TMP/q.safetensors" --quiet 2>/dev/null
    local out bpw
    out=$("$MPQ" eval "$TMP/q.safetensors" "$TEXT" --kl "$TMP/ref.klb" --quiet)
    # every stored byte of the layers' packed maps over their weights
    bpw=$("$MPQ" inspect "$TMP/q.safetensors" |
        awk '$1 ~ /^blk\./ && $3 == "bitplane" { split($2, s, "x"); w += s[1] * s[2]; b += 8 * $6 }
             END { printf "%.3f", b / w }')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$q" "$b" "$g" "${rot:-none}" "$bpw" \
        "$(echo "$out" | grep -o 'perplexity: [0-9.]* +/- [0-9.]*' | cut -d' ' -f2-)" \
        "$(echo "$out" | grep -o 'KL divergence: [0-9.]* +/- [0-9.]*' | cut -d' ' -f3-)" \
        "$(echo "$out" | grep -o 'same top token: [0-9.]*' | cut -d' ' -f4) %"
}
for b in 3 4; do
    for rot in "" "--rotate 1"; do
        row RTN $b 128 "$rot" --method rtn
        row AWQ $b 128 "$rot" --method awq
        row "GPTQ (act-order)" $b 128 "$rot" --method gptq --act-order
        row "AWQ + GPTQ (act-order)" $b 128 "$rot" --method gptq --quantizer awq+gptq --act-order
    done
done
for rot in "" "--rotate 1"; do
    row "GPTQ (act-order)" 3 64 "$rot" --method gptq --act-order
    row "AWQ + GPTQ (act-order)" 3 64 "$rot" --method gptq --quantizer awq+gptq --act-order
done
