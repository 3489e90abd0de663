#!/usr/bin/env bash
# Installs what the tests need (Debian packages, when missing), builds mpq
# three ways from scratch and runs every test in each:
#   release   -O3 -march=native: every SIMD path this CPU has, CUDA TU if nvcc
#   sanitize  AddressSanitizer + UndefinedBehaviorSanitizer (any finding fails)
#   portable  plain x86-64, MPQ_NO_SIMD: the scalar kernels and software fp16
# It also compiles mpq.h alone with clang (C11, C++17, -Wall -Wextra -Werror),
# runs the examples, fuzzes the safetensors reader and packed-file loader for
# a minute (libFuzzer, ASan + UBSan), and checks files against the reference
# safetensors package (PyPI, in a virtual environment under build/).
# The last line is "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
root=$(pwd)

need=()
for p in meson ninja-build pkg-config gcc g++ libcriterion-dev libstb-dev libcjson-dev clang libclang-rt-14-dev \
    python3 python3-venv; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "installing: ${need[*]}"
    $sudo apt-get update -qq >/dev/null && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
        { echo "apt-get install failed"; echo "0 passed, 1 failed"; exit 1; }
fi

passed=0 failed=0 skipped=0
check() { # name, command...: one extra check counted as one test
    local name=$1; shift
    if "$@" >"$root/build/check-$name.log" 2>&1; then
        passed=$((passed + 1)); echo "ok   $name"
    else
        failed=$((failed + 1)); echo "FAIL $name (build/check-$name.log):"; tail -n 20 "$root/build/check-$name.log"
    fi
}

run_build() { # name, meson options...
    local name=$1; shift
    local dir="build/$name"
    rm -rf "$dir"
    echo "== $name: meson setup $*"
    if ! meson setup "$dir" "$@" >"build/setup-$name.log" 2>&1 || ! ninja -C "$dir" >"build/ninja-$name.log" 2>&1; then
        echo "FAIL $name: build failed"; tail -n 30 "build/setup-$name.log" "build/ninja-$name.log"
        failed=$((failed + 1)); return
    fi
    meson test -C "$dir" --print-errorlogs >"build/test-$name.log" 2>&1
    local rc=$? log="$dir/meson-logs/testlog.txt"
    local p f s
    p=$(grep -E '^ok ' "$log" | grep -vc '# SKIP')
    s=$(grep -cE '^ok .*# SKIP' "$log")
    f=$(grep -cE '^not ok' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi # a crash outside any test
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    echo "   $name: $p passed, $f failed, $s skipped"
    [ "$f" -ne 0 ] && { grep -E '^not ok' "$log"; tail -n 60 "build/test-$name.log"; }
}

mkdir -p build
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_build release --buildtype=release -Dio=enabled
run_build sanitize --buildtype=debugoptimized -Db_sanitize=address,undefined -Dc_args=-fno-sanitize-recover=all \
    -Dcpp_args=-fno-sanitize-recover=all -Dcuda=disabled -Dbenches=false -Dio=enabled
run_build portable --buildtype=release -Dnative=false -Dsimd=none -Dcuda=disabled -Dio=enabled

if command -v clang >/dev/null 2>&1; then
    printf '#define MPQ_IMPLEMENTATION\n#include "mpq.h"\nint main(void){return 0;}\n' >build/alone.c
    cp build/alone.c build/alone.cpp
    check clang-c11 clang -std=c11 -Wall -Wextra -Werror -march=native -I. -c build/alone.c -o build/alone-c.o
    check clang-cxx17 clang++ -std=c++17 -Wall -Wextra -Werror -march=native -I. -c build/alone.cpp -o build/alone-cpp.o
    # the file I/O beside the header: strict C11, and its header from C++
    printf '#include "mpq_io.h"\nint main(void){return 0;}\n' >build/io-alone.cpp
    check clang-io-c11 clang -std=c11 -Wall -Wextra -Werror -I. -c mpq_io.c -o build/mpq_io-clang.o
    check clang-io-cxx17 clang++ -std=c++17 -Wall -Wextra -Werror -I. -c build/io-alone.cpp -o build/io-alone-cpp.o
fi
if [ -x build/release/quickstart ]; then
    check quickstart build/release/quickstart
    check demo-small build/release/demo --rows 300 --cols 1000
fi
if [ -x build/release/tinylm ]; then # the main job, end to end
    check tinylm build/release/tinylm --out build/tinylm
fi

# libFuzzer on the reader and the packed-file loader, seeded with the valid
# and crafted files of test_io (a crash or a sanitizer finding fails it)
fuzz() {
    rm -rf build/fuzz-seeds build/fuzz-corpus && mkdir -p build/fuzz-seeds build/fuzz-corpus &&
    clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
        test/fuzz/fuzz_io.c mpq_io.c -lcjson -lm -o build/fuzz_io &&
    (cd build/sanitize && MPQ_FUZZ_CORPUS="$root/build/fuzz-seeds" ./test_io --jobs 1 >/dev/null) &&
    build/fuzz_io -max_total_time="${MPQ_FUZZ_SECONDS:-60}" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -dict=test/fuzz/safetensors.dict build/fuzz-corpus build/fuzz-seeds
}
if [ -x build/sanitize/test_io ] && command -v clang >/dev/null 2>&1; then
    check fuzz-io fuzz
fi

# files written by mpq open in the reference implementation and vice versa
interop() {
    { [ -x build/venv/bin/python ] || python3 -m venv build/venv; } &&
    build/venv/bin/pip install -q --disable-pip-version-check 'safetensors==0.8.0' numpy &&
    build/venv/bin/python test/interop.py build/release
}
if [ -x build/release/st_tool ]; then
    check interop interop
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
