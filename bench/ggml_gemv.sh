#!/usr/bin/env bash
# mpq's CPU GEMV against ggml's CPU matrix-vector products at the same shape,
# 4096 x 14336 (Llama-3-8B's down projection; batch 1), in one run:
# ggml's own benchmark, `test-backend-ops perf -o MUL_MAT -b CPU`, on its
# types q4_0 (4.5 bpw), q3_K (3.4375), q4_K (4.5) and f32, and
# `bench_gemv --shape 4096x14336` on each mpq kernel path this CPU has,
# alternating --rounds times; then the ratios of the medians (ggml time
# over mpq time: above 1, mpq is faster). test-backend-ops gives ggml's CPU
# backend half the hardware threads (1 on a 2-core machine), so mpq runs
# with as many (--threads overrides both only for mpq: it says so).
# llama.cpp comes from the llama-cpp-python source package on PyPI, built
# outside the repository (bench/llama_cpp.sh). --isa avx2 compares what an
# AVX2 machine would run, on this one: ggml built without AVX-512
# (GGML_NATIVE=OFF) against mpq's paths that need no AVX-512.
#
#   bash bench/ggml_gemv.sh [--rounds R] [--threads T] [--isa native|avx2] [--out FILE]
set -eu
cd "$(dirname "$0")/.."
rounds=3 threads="" out="" isa=native
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --isa) isa=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: bash bench/ggml_gemv.sh [--rounds R] [--threads T] [--isa native|avx2] [--out FILE]" >&2; exit 1 ;;
    esac
done
case "$isa" in native) suffix="" ;; avx2) suffix=-avx2 ;; *) echo "--isa: native or avx2" >&2; exit 1 ;; esac
[ -n "$out" ] || out=bench/results/cpu-ggml-gemv$suffix-$(date +%F).txt
llama_isa=$isa
source bench/llama_cpp.sh
llama_cpp_build test-backend-ops
ggml_threads=$(( $(nproc) / 2 )); [ "$ggml_threads" -ge 1 ] || ggml_threads=1
[ -n "$threads" ] || threads=$ggml_threads
[ -d build/release ] || meson setup build/release --buildtype=release -Dio=enabled >/dev/null
ninja -C build/release bench_gemv >/dev/null
mapfile -t paths < <(build/release/bench_gemv --list-paths)
if [ "$isa" = avx2 ]; then # the paths an AVX2 machine has
    mapfile -t paths < <(printf '%s\n' "${paths[@]}" | grep -v '^avx512')
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
    echo "# bench/ggml_gemv.sh --rounds $rounds, $(date -u +%FT%TZ)"
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
        "flags: $(grep -o -w -E 'avx512vbmi|avx512_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "# ggml: llama-cpp-python $llama_version (vendor/llama.cpp), GGML_NATIVE=$llama_native, $ggml_threads thread(s);" \
        "mpq: build/release, paths ${paths[*]}, $threads thread(s)"
    for r in $(seq "$rounds"); do
        echo "## round $r"
        "$llama_bin/test-backend-ops" perf -o MUL_MAT -b CPU \
            -p 'type_a=(q4_0|q3_K|q4_K|f32),type_b=f32,m=4096,n=1,k=14336,' 2>&1 |
            grep -o 'type_a=[a-zA-Z0-9_]*\|[0-9.]* us/run' | paste -d' ' - - | tee -a "$tmp/ggml"
        for p in "${paths[@]}"; do
            build/release/bench_gemv --shape 4096x14336 --threads "$threads" --path "$p" 2>&1 |
                awk -v p="$p" '$1 == "4096x14336" && $3 != "quantize+pack:" { print p, $2, $4 }' | tee -a "$tmp/mpq"
        done
    done
    echo
    echo "## medians over the rounds: mpq path, weight bits (+0.25 of fp16 scales and zeros), us, ggml time / mpq time"
    awk '
        function median(s,   n, a, i, j, t) {
            n = split(s, a, " ")
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        FNR == 1 { f++ }
        f == 1 { sub("type_a=", "", $1); g[$1] = g[$1] " " $2 }
        f == 2 { k = $1 " " $2; m[k] = m[k] " " $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
        END {
            printf "ggml us (median):"
            for (t in g) printf " %s %.1f", t, median(g[t])
            printf "\n%-12s %5s %9s %9s %9s %9s %9s\n", "mpq path", "bits", "us", "vs q4_0", "vs q3_K", "vs q4_K", "vs f32"
            for (i = 1; i <= n; i++) {
                split(order[i], kk, " ")
                us = median(m[order[i]])
                printf "%-12s %5s %9.1f %8.2fx %8.2fx %8.2fx %8.2fx\n", kk[1], kk[2], us, median(g["q4_0"]) / us,
                       median(g["q3_K"]) / us, median(g["q4_K"]) / us, median(g["f32"]) / us
            }
        }' "$tmp/ggml" "$tmp/mpq"
} | tee "$out"
echo "wrote $out"
