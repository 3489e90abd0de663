#!/usr/bin/env bash
# Checks a binary built without -march (x86-64 baseline) for instructions
# beyond SSE2 outside mpq.h's SIMD kernels: AVX (VEX/EVEX-encoded, ymm, zmm,
# opmask registers) may appear only in the functions compiled under a target
# attribute, which run only after the CPU probe says they can. Any other
# function using them could raise SIGILL on an older CPU.
#   bash test/isa_check.sh BINARY...
set -eu
for bin in "$@"; do
echo "$bin:"
objdump -d --no-show-raw-insn "$bin" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $2; next }
    /\t(v[a-z0-9]+|k[a-z]+)[ \t]/ || /%[yz]mm|%k[0-7]/ { use[fn] = 1 }
    END {
        bad = 0; n = 0
        for (f in use) {
            n++
            if (f !~ /(avx2|avx512|vnni|256|512)/) { print "outside the kernels: " f; bad = 1 }
        }
        if (n == 0) { print "no SIMD kernel found (was the binary built with MPQ_NO_SIMD?)"; bad = 1 }
        else if (!bad) print n " functions use AVX, all of them kernels"
        exit bad
    }'
done
