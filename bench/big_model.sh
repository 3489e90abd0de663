#!/usr/bin/env bash
# A model larger than this machine's memory through mpq's pipeline, each
# step timed and its memory recorded:
#   - bench_random_llm writes a Llama-3-8B-shaped checkpoint (dim 4096, ffn
#     14336, 32/8 heads, vocabulary 128256, untied head) in BF16, in shards
#     with their index: about 16 GB with all 32 layers (--layers N: the
#     first N, for a shorter run; each step's memory does not depend on N
#     but for the kept hidden states);
#   - calibrate: --stats (default xtx,fisher,mixllm,acts: X^T X, the Fisher
#     diagonal and the rest) over --windows windows of --length tokens of
#     the calibration text, a layer at a time, the weights used in place;
#   - quantize: GPTQ 4-bit (group 128) from those X^T X, and (with fisher)
#     SFMP at 3.5 bpw with GPTQ under it; the head at 6 bits, the embedding
#     kept;
#   - eval: perplexity of the float model (in place) and of the results on
#     --chunks chunks of 512 tokens of the evaluation text;
#   - speed: decode of the SFMP result (`mpq speed`, 64 tokens; without
#     fisher the GPTQ one), its bytes read per token against the rate
#     bench_gemv reaches on the same shapes at 3.25 bits (3.5 bpw with
#     metadata; 4 for the GPTQ result; the head on its shape at its width)
#     and threads, weighted by each map's bytes.
# For each step: wall time, and the peaks of the process's anonymous memory
# (RssAnon, sampled every 0.1 s from /proc) and of its resident set (VmHWM,
# which counts mapped file pages too).
#
# --smollm2 runs the same steps on SmolLM2-135M-Instruct's GGUF (examples/
# fetch.sh) and checks that the streamed steps give what the in-memory
# ones give: `mpq calibrate` against `mpq calibrate --in-memory` (every
# tensor's bytes), `mpq eval` in place against --in-memory (the printed
# perplexity).
#
#   bash bench/big_model.sh [--layers N] [--windows W] [--length T] [--chunks C]
#                           [--stats LIST] [--steps LIST] [--threads T] [--dir DIR] [--out FILE] [--smollm2]
#
# --steps (default calibrate,quantize,eval,speed) runs only those (a group,
# or one step by its name in the table: quantize-gptq4, eval-sfmp3.5 ...);
# the others' files are taken from an earlier run in DIR (a new build's
# quantize, eval and speed on statistics already gathered).
#
# DIR (default build/bench/llama3-8b-bf16-L<N>) keeps the checkpoint between
# runs; with 32 layers the statistics file takes about 16 GB for X^T X
# (once per input, its triangle) and 28 GB for the Fisher diagonal (4 bytes
# a weight), the checkpoint 16 GB (--stats xtx where the disk has no room
# for both). Writes the table to FILE (default
# bench/results/cpu-big-model[-smollm2]-DATE.txt).
set -eu
cd "$(dirname "$0")/.."
layers=32 windows=2 length=256 chunks=1 threads=2 dir="" out="" smol=0 stats_list=xtx,fisher,mixllm,acts
steps=calibrate,quantize,eval,speed
usage="usage: bash bench/big_model.sh [--layers N] [--windows W] [--length T] [--chunks C] [--stats LIST] [--steps LIST] [--threads T] [--dir DIR] [--out FILE] [--smollm2]"
while [ $# -gt 0 ]; do
    case "$1" in
    --layers) layers=$2; shift 2 ;;
    --windows) windows=$2; shift 2 ;;
    --length) length=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --stats) stats_list=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --smollm2) smol=1; shift ;;
    *) echo "$usage" >&2; exit 1 ;;
    esac
done
bash examples/fetch.sh >/dev/null
[ -x build/release/mpq ] || meson setup build/release --buildtype=release -Dio=enabled >/dev/null
ninja -C build/release mpq bench_random_llm bench_gemv >/dev/null
mpq=build/release/mpq
calib=build/text/calib.txt text=build/text/eval.txt
if [ $smol = 1 ]; then
    model=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -n "$dir" ] || dir=build/bench/big-model-smollm2
    [ -n "$out" ] || out=bench/results/cpu-big-model-smollm2-$(date +%F).txt
else
    [ -n "$dir" ] || dir=build/bench/llama3-8b-bf16-L$layers
    [ -n "$out" ] || out=bench/results/cpu-big-model-$(date +%F).txt
    model=$dir/hf
fi
mkdir -p "$dir"
work=$dir/run
mkdir -p "$work"
export OMP_NUM_THREADS=$threads

# want GROUP: whether --steps names it
want() { case ",$steps," in *,"$1",*) return 0 ;; *) return 1 ;; esac; }

# step NAME COMMAND...: runs it (unless --steps names neither NAME nor its
# group, the part before the first '-'), a row of the table: wall seconds,
# peak RssAnon and VmHWM in GB
step() {
    local name=$1
    shift
    want "$name" || want "${name%%-*}" || return 0
    local log="$work/$name.log" t0 t1 pid anon=0 hwm=0 a h
    t0=$(date +%s.%N)
    "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        read -r a h < <(awk '/^RssAnon:/ {a = $2} /^VmHWM:/ {h = $2} END {print a + 0, h + 0}' \
            "/proc/$pid/status" 2>/dev/null || echo "0 0")
        [ "${a:-0}" -gt "$anon" ] && anon=$a
        [ "${h:-0}" -gt "$hwm" ] && hwm=$h
        sleep 0.1
    done
    if ! wait "$pid"; then
        echo "step $name failed ($log):" >&2
        tail -5 "$log" >&2
        exit 1
    fi
    t1=$(date +%s.%N)
    awk -v n="$name" -v t0="$t0" -v t1="$t1" -v a="$anon" -v h="$hwm" \
        'BEGIN { printf "| %s | %.1f | %.2f | %.2f |\n", n, t1 - t0, a / 1048576, h / 1048576 }' | tee -a "$out"
}

: >"$out"
{
    echo "# bench/big_model.sh $(date -u +%FT%TZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $threads threads"
    echo "# $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $([ $smol = 1 ] && echo "$model" || echo "8B shape, $layers layers"), windows $windows x $length, chunks $chunks; steps $steps"
    echo "| step | wall s | peak RssAnon GB | peak VmHWM GB |"
    echo "| --- | ---: | ---: | ---: |"
} | tee -a "$out"

if [ $smol = 0 ] && [ ! -f "$model/model.safetensors.index.json" ]; then
    step generate build/release/bench_random_llm --dim 4096 --ffn 14336 --heads 32 --kv-heads 8 --layers "$layers" \
        --vocab 128256 --dtype bf16 --shards $(((layers + 3) / 4)) "$model"
fi
stats=$work/stats.safetensors
step calibrate "$mpq" calibrate --quiet --stats "$stats_list" --windows "$windows" --length "$length" \
    "$model" "$calib" -o "$stats"
if [ $smol = 1 ] && want calibrate; then
    step calibrate-in-memory "$mpq" calibrate --quiet --in-memory --stats "$stats_list" \
        --windows "$windows" --length "$length" "$model" "$calib" -o "$work/stats-mem.safetensors"
    python3 - "$stats" "$work/stats-mem.safetensors" <<'EOF' | tee -a "$out"
import json, struct, sys
def load(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        base = 8 + n
        meta = h.pop("__metadata__", {})
        out = {}
        for k, v in h.items():
            f.seek(base + v["data_offsets"][0])
            out[k] = (v["dtype"], v["shape"], f.read(v["data_offsets"][1] - v["data_offsets"][0]))
        return out, meta
a, ma = load(sys.argv[1])
b, mb = load(sys.argv[2])
same = set(a) == set(b) and all(a[k] == b[k] for k in a) and ma == mb
print("# streamed statistics against --in-memory: %d tensors, %s" % (len(a), "identical" if same else "DIFFERENT"))
sys.exit(0 if same else 1)
EOF
fi
q4=$work/gptq4.safetensors s35=$work/sfmp35.safetensors
case ",$stats_list," in *,fisher,*) sfmp=1 ;; *) sfmp=0 ;; esac
step quantize-gptq4 "$mpq" quantize --quiet --method gptq --bits 4 --group 128 --embed-bits 6 --stats "$stats" \
    "$model" "$q4"
if [ $sfmp = 1 ]; then
    step quantize-sfmp3.5-gptq "$mpq" quantize --quiet --method sfmp --bpw 3.5 --quantizer gptq --group 128 \
        --embed-bits 6 --stats "$stats" "$model" "$s35"
fi
step eval-float "$mpq" eval --quiet --chunks "$chunks" "$model" "$text"
if [ $smol = 1 ] && want eval; then
    step eval-float-in-memory "$mpq" eval --quiet --in-memory --chunks "$chunks" "$model" "$text"
    a=$(grep -m1 '^perplexity' "$work/eval-float.log" | sed 's/, [0-9.]* tokens\/s//')
    b=$(grep -m1 '^perplexity' "$work/eval-float-in-memory.log" | sed 's/, [0-9.]* tokens\/s//')
    [ "$a" = "$b" ] && r=identical || r=DIFFERENT
    echo "# eval in place against --in-memory: $r ($a)" | tee -a "$out"
fi
step eval-gptq4 "$mpq" eval --quiet --chunks "$chunks" "$q4" "$text"
if [ $sfmp = 1 ]; then step eval-sfmp3.5 "$mpq" eval --quiet --chunks "$chunks" "$s35" "$text"; fi
for f in eval-float eval-gptq4 eval-sfmp3.5; do
    if { want eval || want "$f"; } && [ -f "$work/$f.log" ]; then echo "# $f: $(grep -m1 '^perplexity' "$work/$f.log")" | tee -a "$out"; fi
done
if [ $sfmp = 1 ]; then sp=sfmp3.5 sf=$s35 sb=3.25; else sp=gptq4 sf=$q4 sb=4.00; fi
step speed-$sp "$mpq" speed --threads "$threads" "$sf"
if want speed || want "speed-$sp"; then echo "# speed: $(grep 'tg' "$work/speed-$sp.log" | tail -1)" | tee -a "$out"; fi
if [ $smol = 0 ] && { want speed || want "speed-$sp"; }; then
    # bytes a decoded token reads (the packed maps of the layers and the
    # head), and the time the kernels alone take for them: each map at the
    # rate bench_gemv reaches on its shape (the 4096-column maps at the
    # 4096x4096 rate) and width, the head on its own shape at its own width
    build/release/bench_gemv --threads "$threads" >"$work/gemv.log" 2>&1 # the three shapes of these layers
    read -r hshape hbits < <("$mpq" inspect "$sf" | awk '$1 == "lm_head.weight" { print $2, $4 }')
    build/release/bench_gemv --threads "$threads" --shape "$hshape" --bpw "$hbits" >"$work/gemv-head.log" 2>&1
    tg=$(grep 'tg' "$work/speed-$sp.log" | tail -1 | awk -F'|' '{ split($7, v, " "); print v[1] }')
    "$mpq" inspect "$sf" | awk -v tg="$tg" -v sb="$sb" -v hs="$hshape" '
        FILENAME ~ /gemv-head.log$/ { if ($1 == hs && $3 ~ /^[0-9]+$/) head = $5; next }
        FILENAME ~ /gemv.log$/ { if ($2 == sb && $3 ~ /^[0-9]+$/) gbs[$1] = $5; next }
        $3 == "bitplane" && $1 != "model.embed_tokens.weight" {
            split($2, d, "x")
            s = d[2] == 14336 ? "4096x14336" : d[1] == 4096 || d[1] == 1024 ? "4096x4096" : "14336x4096"
            bytes += $NF
            t += $NF / (($1 == "lm_head.weight" ? head : gbs[s]) * 1e9)
        }
        END {
            printf "# decode reads %.3f GB per token at %.2f tokens/s: %.1f GB/s; bench_gemv at %s bits: ", bytes / 1e9, tg, bytes * tg / 1e9, sb
            for (s in gbs) printf "%s %.1f GB/s  ", s, gbs[s]
            printf "head %s %.1f GB/s\n# the kernels alone would take %.1f ms per token: decode reaches %.2f of their rate\n", hs, head, t * 1e3, t * tg
        }' "$work/gemv.log" "$work/gemv-head.log" - | tee -a "$out"
fi
echo "# raw logs: $work" | tee -a "$out"
