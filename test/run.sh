#!/usr/bin/env bash
# Installs what the tests need (Debian packages, when missing), builds mpq
# three ways from scratch and runs every test in each:
#   release   -O3 -march=native: every SIMD path this CPU has, CUDA TU if nvcc
#   sanitize  AddressSanitizer + UndefinedBehaviorSanitizer (any finding fails),
#             no -march: the SIMD kernels chosen at run time
#   portable  plain x86-64, MPQ_NO_SIMD: the scalar kernels and software fp16
#   aarch64   the header-only tests cross-compiled for AArch64 (NEON path) and
#             run under qemu-user (test/aarch64.sh, test/criterion_shim.h)
# It also compiles mpq.h alone with clang (C11, C++17, -Wall -Wextra -Werror),
# checks every source against .clang-format (test/format_check.sh),
# builds the README's program as a user would (test/readme_check.sh), checks
# that the examples' READMEs quote the tables of their results.md
# (test/quote_check.sh), checks
# the allocator macros (test/alloc_check.c), installs mpq and builds a
# program against it (test/install_check.sh),
# runs the examples, fuzzes the safetensors reader and packed-file loader, and
# the GGUF, model, tokenizer and text readers, a minute each (libFuzzer, ASan +
# UBSan), and checks files against the reference
# safetensors package (PyPI, in a virtual environment under build/).
# The last line is "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
root=$(pwd)

. util/need.sh
need_debs meson ninja-build pkg-config gcc g++ libcriterion-dev libstb-dev libcjson-dev clang libclang-rt-14-dev \
    clang-format-14 python3 python3-venv gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user cmake ||
    { echo "apt-get install failed"; echo "0 passed, 1 failed"; exit 1; }

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
run_build sanitize --buildtype=debugoptimized -Dnative=false -Db_sanitize=address,undefined -Dc_args=-fno-sanitize-recover=all \
    -Dcpp_args=-fno-sanitize-recover=all -Dcuda=disabled -Dbenches=false -Dio=enabled
run_build portable --buildtype=release -Dnative=false -Dsimd=none -Dcuda=disabled -Dio=enabled
# the sanitize build has no -march: AVX only inside the kernels the CPU probe guards
[ -x build/sanitize/mpq ] && check isa-dispatch bash test/isa_check.sh build/sanitize/test_gemv build/sanitize/mpq

# AArch64: the NEON path, the header-only tests cross-compiled and run under qemu-user
echo "== aarch64: bash test/aarch64.sh build/aarch64"
bash test/aarch64.sh build/aarch64 >build/test-aarch64.log 2>&1
a64=$(tail -n 1 build/test-aarch64.log)
if [[ "$a64" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
    passed=$((passed + BASH_REMATCH[1])) failed=$((failed + BASH_REMATCH[2])) skipped=$((skipped + BASH_REMATCH[3]))
    echo "   aarch64: $a64"
    [ "${BASH_REMATCH[2]}" -ne 0 ] && grep -E '^.*not ok' build/test-aarch64.log
else
    failed=$((failed + 1)); echo "FAIL aarch64 (build/test-aarch64.log):"; tail -n 30 build/test-aarch64.log
fi

if command -v clang >/dev/null 2>&1; then
    printf '#define MPQ_IMPLEMENTATION\n#include "mpq.h"\nint main(void){return 0;}\n' >build/alone.c
    cp build/alone.c build/alone.cpp
    check clang-c11 clang -std=c11 -Wall -Wextra -Werror -march=native -I. -c build/alone.c -o build/alone-c.o
    check clang-cxx17 clang++ -std=c++17 -Wall -Wextra -Werror -march=native -I. -c build/alone.cpp -o build/alone-cpp.o
    # without -march: every SIMD kernel still compiles, under its own target attribute
    check clang-c11-generic clang -std=c11 -O2 -Wall -Wextra -Werror -I. -c build/alone.c -o build/alone-gc.o
    check gcc-cxx17-generic g++ -std=c++17 -O2 -Wall -Wextra -Werror -I. -c build/alone.cpp -o build/alone-gcpp.o
    # the files beside the header (I/O, tokenizer, model): strict C11, and
    # their headers from C++
    printf '#include "mpq_io.h"\n#include "mpq_tokenizer.h"\n#include "mpq_model.h"\nint main(void){return 0;}\n' >build/io-alone.cpp
    io_c11() {
        local f
        for f in mpq_io.c mpq_io_gguf.c mpq_io_source.c mpq_tokenizer.c mpq_model.c mpq_calib.c; do
            clang -std=c11 -Wall -Wextra -Werror -I. -c "$f" -o "build/${f%.c}-clang.o" || return 1
        done
    }
    check clang-io-c11 io_c11
    check clang-io-cxx17 clang++ -std=c++17 -Wall -Wextra -Werror -I. -c build/io-alone.cpp -o build/io-alone-cpp.o
fi
# every source laid out as .clang-format says
check clang-format bash test/format_check.sh
# the README's program as a user builds it; the examples' quoted tables; the allocator macros
check readme-quickstart bash test/readme_check.sh build/readme
check readme-quotes bash test/quote_check.sh build/quote-check
alloc_check() {
    gcc -O1 -Wall -Wextra -Werror -I. test/alloc_check.c -o build/alloc_check -lm && build/alloc_check &&
        ! gcc -I. -DMPQ_HALF_ALLOCATOR -c test/alloc_check.c -o build/alloc_half.o
}
check allocator-macros alloc_check
# meson install into a staging prefix, a program built against it with pkg-config, and as a meson subproject
check install-and-consume bash test/install_check.sh build/install-check
if [ -x build/release/quickstart ]; then
    check quickstart build/release/quickstart
    check demo-small build/release/demo --rows 300 --cols 1000
fi
if [ -x build/release/tinylm ]; then # the main job, end to end
    check tinylm build/release/tinylm --out build/tinylm
fi

# libFuzzer, ASan + UBSan (a crash or a sanitizer finding fails it):
#   fuzz-io     the safetensors reader and the packed-file loader, seeded with
#               the valid and crafted files of test_io
#   fuzz-model  GGUF files (metadata, tensors, tokenizer, the model loaded and
#               run), tokenizer.json, statistics and measurements files and
#               text, seeded with
#               the files of test_gguf, test_model and test_calib and a few
#               texts
fuzz_seconds=${MPQ_FUZZ_SECONDS:-60}
fuzz_flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.)
fuzz_io() {
    rm -rf build/fuzz-seeds build/fuzz-corpus && mkdir -p build/fuzz-seeds build/fuzz-corpus &&
    clang "${fuzz_flags[@]}" test/fuzz/fuzz_io.c mpq_io.c mpq_io_gguf.c -lcjson -lm -o build/fuzz_io &&
    (cd build/sanitize && MPQ_FUZZ_CORPUS="$root/build/fuzz-seeds" MPQ_SOURCE_ROOT="$root" ./test_io --jobs 1 \
        >/dev/null) &&
    cp test/data/packed_v1.safetensors build/fuzz-seeds/ &&
    build/fuzz_io -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -dict=test/fuzz/safetensors.dict build/fuzz-corpus build/fuzz-seeds
}
fuzz_model() {
    local seeds=build/fuzz-model-seeds corpus=build/fuzz-model-corpus
    rm -rf "$seeds" "$corpus" && mkdir -p "$seeds" "$corpus" &&
    clang "${fuzz_flags[@]}" test/fuzz/fuzz_model.c mpq_io.c mpq_io_gguf.c mpq_io_source.c mpq_tokenizer.c \
        mpq_model.c mpq_calib.c -lcjson -lm -o build/fuzz_model &&
    (cd build/sanitize && MPQ_FUZZ_CORPUS="$root/$seeds" ./test_gguf --jobs 1 >/dev/null &&
        MPQ_FUZZ_CORPUS="$root/$seeds" ./test_model --jobs 1 >/dev/null &&
        MPQ_FUZZ_CORPUS="$root/$seeds" ./test_calib --jobs 1 --filter 'calib/determ*' >/dev/null &&
        MPQ_FUZZ_CORPUS="$root/$seeds" ./test_calib --jobs 1 --filter 'calib/xtx*' >/dev/null &&
        MPQ_FUZZ_CORPUS="$root/$seeds" ./test_calib --jobs 1 --filter 'calib/measurement_file*' >/dev/null) &&
    printf 'Hello, world! I'"'"'m 42 years old.\n\n  x\ty' >"$seeds/text-1.txt" &&
    printf 'caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac 3.14159 <|im_end|> \xf0\x9f\x99\x82\r\n' >"$seeds/text-2.txt" &&
    head -c 4000 README.md >"$seeds/text-3.txt" &&
    build/fuzz_model -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 "$corpus" "$seeds"
}
if command -v clang >/dev/null 2>&1; then
    [ -x build/sanitize/test_io ] && check fuzz-io fuzz_io
    [ -x build/sanitize/test_model ] && check fuzz-model fuzz_model
fi

# files written by mpq open in the reference implementation and vice versa
interop() {
    { [ -x build/venv/bin/python ] || python3 -m venv build/venv; } &&
    build/venv/bin/pip install -q --disable-pip-version-check 'safetensors==0.8.0' 'gguf==0.19.0' numpy &&
    build/venv/bin/python test/interop.py build/release
}
if [ -x build/release/st_tool ]; then
    check interop interop
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
