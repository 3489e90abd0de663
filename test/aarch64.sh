#!/usr/bin/env bash
# Cross-compiles the header-only tests for AArch64 (the NEON path; Debian's
# gcc-aarch64-linux-gnu) against test/criterion_shim.h, statically, and runs
# them under qemu-user (qemu-aarch64). Also compiles mpq.h alone for AArch64
# (C11, and C++17 when aarch64-linux-gnu-g++ is there) with -Werror.
# Prints each test's TAP line and ends with "N passed, N failed, N skipped";
# exits non-zero when anything failed.
#   bash test/aarch64.sh [BUILD_DIR]
set -u
cd "$(dirname "$0")/.."
out=${1:-build/aarch64}
cc=aarch64-linux-gnu-gcc cxx=aarch64-linux-gnu-g++
mkdir -p "$out"
passed=0 failed=0 skipped=0
note() { # name, ok?: one line of a check that is not a test program
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; fi
}

printf '#define MPQ_IMPLEMENTATION\n#include "mpq.h"\nint main(void) { return mpq_path_available(MPQ_PATH_NEON) ? 0 : 1; }\n' \
    >"$out/alone.c"
$cc -std=c11 -O2 -Wall -Wextra -Werror -I. -c "$out/alone.c" -o "$out/alone.o"
note "aarch64 C11 header alone" $?
if command -v "$cxx" >/dev/null; then
    cp "$out/alone.c" "$out/alone.cpp"
    $cxx -std=c++17 -O2 -Wall -Wextra -Werror -I. -c "$out/alone.cpp" -o "$out/alone-cpp.o"
    note "aarch64 C++17 header alone" $?
fi
$cc -static -O2 "$out/alone.o" -o "$out/alone" -lm && qemu-aarch64 "$out/alone"
note "aarch64 NEON path available" $?

for t in basics half quant pack gemv mxint sparse backend awq select stats plan requant pmpd gptq recipe; do
    exe="$out/test_$t"
    if ! $cc -std=c11 -O2 -static -fopenmp -Wall -Wextra -Werror -DMPQ_TEST_SHIM -I. -Itest -Iutil \
        "test/test_$t.c" -o "$exe" -lm -lpthread 2>"$out/build-$t.log"; then
        cat "$out/build-$t.log"
        note "build test_$t" 1
        continue
    fi
    qemu-aarch64 "$exe" >"$out/test-$t.log" 2>&1
    rc=$?
    grep -E '^(not )?ok ' "$out/test-$t.log" | sed "s/^/$t: /"
    p=$(grep -E '^ok ' "$out/test-$t.log" | grep -vc '# SKIP')
    s=$(grep -cE '^ok .*# SKIP' "$out/test-$t.log")
    f=$(grep -cE '^not ok' "$out/test-$t.log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then # a crash: the rest of the program did not run
        f=1
        echo "not ok - test_$t ended with status $rc"
    fi
    [ "$f" -ne 0 ] && tail -n 30 "$out/test-$t.log"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
