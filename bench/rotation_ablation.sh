#!/bin/bash
# bench/rotation_ablation.sh: each quantizer at 3 and 4 bits (and 3 bits at
# group 64, 3.5 bpw), with and without the incoherence rotation, GPTQ's
# X^T X from the float model or sequential (--sequential: each layer's after
# the quantized layers before it), and SFMP + GPTQ rotated at the targets'
# budgets, on SmolLM2 and the main job's evaluation text: perplexity and KL
# divergence to the float model over --chunks chunks (default 32), through
# `mpq quantize` and `mpq eval` as a user runs them. Needs what `bash
# examples/run.sh` made: build/models, build/text,
# build/llm/{stats,hessian,stats_rot}.safetensors, and the tool (MPQ,
# default build/release/mpq).
#   bash bench/rotation_ablation.sh [--chunks N] [--only base|seq|targets|allin] > bench/results/cpu-rotation-ablation-DATE.txt
# --only: one part (base: the quantizers with and without the rotation;
# seq: GPTQ and AWQ + GPTQ sequential; targets: SFMP + GPTQ rotated at 3.25,
# 3.5 and 4.25 bpw; allin: SFMP + AWQ + GPTQ rotated with every stored byte
# at those budgets); default all four.
set -euo pipefail
cd "$(dirname "$0")/.."
MPQ=${MPQ:-build/release/mpq}
CHUNKS=32 ONLY=all
while [ $# -gt 0 ]; do
    case "$1" in
    --chunks) CHUNKS=$2 && shift 2 ;;
    --only) ONLY=$2 && shift 2 ;;
    *) echo "usage: $0 [--chunks N] [--only base|seq|targets|allin]" >&2 && exit 1 ;;
    esac
done
part() { [ "$ONLY" = all ] || [ "$ONLY" = "$1" ]; }
MODEL=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=build/text/eval.txt
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "# mpq rotation ablation: $MODEL, $TEXT, $CHUNKS chunks of 512, $(date -u +%F)"
echo "# reference (fp32, the GGUF dequantized):"
"$MPQ" eval "$MODEL" "$TEXT" --chunks "$CHUNKS" --kl-base "$TMP/ref.klb" --quiet | sed 's/^/#   /'
printf '\n| quantizer | bits | group | rotation | bpw (linear maps) | perplexity | KLD | same top |\n|---|---|---|---|---|---|---|---|\n'
row() { # quantizer bits group rotate-args... options (bits "-": the options give the budget)
    local q=$1 b=$2 g=$3 rot=$4
    shift 4
    local bits=(--bits "$b")
    [ "$b" = - ] && bits=()
    "$MPQ" quantize "$@" "${bits[@]}" --group "$g" $rot --embed-bits 8 --stats build/llm/stats.safetensors \
        --hessian build/llm/hessian.safetensors "$MODEL" "$TMP/q.safetensors" --quiet 2>/dev/null
    local out bpw
    out=$("$MPQ" eval "$TMP/q.safetensors" "$TEXT" --kl "$TMP/ref.klb" --quiet)
    # every stored byte of the layers' packed maps over their weights (bytes: the last column; a mixed
    # plan's widths take several)
    bpw=$("$MPQ" inspect "$TMP/q.safetensors" |
        awk '$1 ~ /^blk\./ && $3 == "bitplane" { split($2, s, "x"); w += s[1] * s[2]; b += 8 * $NF }
             END { printf "%.3f", b / w }')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$q" "$b" "$g" "${rot:-none}" "$bpw" \
        "$(echo "$out" | grep -o 'perplexity: [0-9.]* +/- [0-9.]*' | cut -d' ' -f2-)" \
        "$(echo "$out" | grep -o 'KL divergence: [0-9.]* +/- [0-9.]*' | cut -d' ' -f3-)" \
        "$(echo "$out" | grep -o 'same top token: [0-9.]*' | cut -d' ' -f4) %"
}
if part base; then
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
fi
if part seq; then # X^T X over the same 64 windows of 512 as build/llm/hessian.safetensors
    for b in 3 4; do
        for rot in "" "--rotate 1"; do
            row "GPTQ (act-order), sequential" $b 128 "$rot" --method gptq --act-order --sequential build/text/calib.txt
            row "AWQ + GPTQ (act-order), sequential" $b 128 "$rot" --method gptq --quantizer awq+gptq --act-order \
                --sequential build/text/calib.txt
        done
    done
fi
if part targets; then # SFMP's Fisher of the rotated weights (mpq calibrate --rotate 1 --stats fisher)
    for bpw in "3.25 256" "3.5 128" "4.25 128"; do
        set -- $bpw
        row "SFMP $1 + GPTQ (act-order)" - "$2" "--rotate 1" --method sfmp --bpw "$1" --quantizer gptq --act-order \
            --salience build/llm/stats_rot.safetensors
        row "SFMP $1 + AWQ + GPTQ (act-order)" - "$2" "--rotate 1" --method sfmp --bpw "$1" --quantizer awq+gptq \
            --act-order --salience build/llm/stats_rot.safetensors
    done
fi
if part allin; then # the same with the budget lowered by what AWQ's scales, the plan's metadata and the
    # rotation add (0.11 bpw), so that every stored byte lands on the target
    for bpw in "3.14 256" "3.39 128" "4.14 128"; do
        set -- $bpw
        row "SFMP $1 + AWQ + GPTQ (act-order)" - "$2" "--rotate 1" --method sfmp --bpw "$1" --quantizer awq+gptq \
            --act-order --salience build/llm/stats_rot.safetensors
    done
fi
