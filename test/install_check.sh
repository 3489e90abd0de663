#!/usr/bin/env bash
# mpq as a user outside the repository gets it: `meson install` into a
# staging prefix (with the CUDA backend when nvcc is there), then the
# consumers of test/consumer built three ways and run: (1) with the
# compiler and pkg-config alone (mpq.pc, mpq-cuda.pc); (2) with CMake
# (find_package(mpq)); (3) as a meson project with mpq as a subproject
# (dependency('mpq', fallback: ...)). Every installed header and library
# is checked to be there.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build/install-check}
rm -rf "$work" && mkdir -p "$work" && work=$(cd "$work" && pwd) # meson wants an absolute prefix
meson setup "$work/build" "$root" --prefix="$work/stage" -Dlibdir=lib -Dtests=false -Dexamples=false \
    -Dbenches=false -Dio=enabled >"$work/setup.log"
ninja -C "$work/build" >"$work/ninja.log"
meson install -C "$work/build" >"$work/install.log"
cuda=0
[ -e "$work/stage/lib/libmpq_cuda.a" ] && cuda=1
files="include/mpq/mpq.h include/mpq/mpq_io.h include/mpq/mpq_tokenizer.h include/mpq/mpq_model.h
    lib/libmpq_io.a lib/libmpq_tokenizer.a lib/libmpq_model.a lib/pkgconfig/mpq.pc lib/cmake/mpq/mpqConfig.cmake
    lib/cmake/mpq/mpqConfigVersion.cmake bin/mpq"
[ $cuda = 1 ] && files="$files include/mpq/mpq_cuda.h lib/pkgconfig/mpq-cuda.pc"
for f in $files; do
    [ -e "$work/stage/$f" ] || { echo "not installed: $f"; exit 1; }
done
echo "installed: $files (CUDA backend: $cuda)"
# (1) pkg-config
export PKG_CONFIG_PATH=$work/stage/lib/pkgconfig
src=$root/test/consumer
# shellcheck disable=SC2046
cc -std=c11 -O2 -Wall -Wextra -Werror "$src/consumer.c" -o "$work/consumer" $(pkg-config --cflags --libs mpq)
"$work/consumer" "$work/installed.safetensors"
# shellcheck disable=SC2046
cc -std=c11 -O2 -Wall -Wextra -Werror "$src/consumer_model.c" -o "$work/consumer_model" $(pkg-config --cflags --libs mpq)
"$work/consumer_model"
if [ $cuda = 1 ]; then
    # shellcheck disable=SC2046
    cc -std=c11 -O2 -Wall -Wextra -Werror -DMPQ_CONSUMER_CUDA "$src/consumer_model.c" -o "$work/consumer_cuda" \
        $(pkg-config --cflags --libs mpq-cuda mpq)
    "$work/consumer_cuda"
fi
# (2) CMake
cmake -S "$src" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/stage" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" \
    >"$work/cmake-setup.log"
cmake --build "$work/cmake" >"$work/cmake-build.log"
"$work/cmake/consumer" "$work/cmake.safetensors"
"$work/cmake/consumer_model"
[ $cuda = 1 ] && "$work/cmake/consumer_cuda"
# (3) the subproject: a copy of the project beside the repository's files, mpq under subprojects/
mkdir -p "$work/sub/subprojects"
cp "$src/meson.build" "$src/consumer.c" "$src/consumer_model.c" "$work/sub/"
ln -s "$root" "$work/sub/subprojects/mpq"
meson setup "$work/sub/build" "$work/sub" >"$work/sub-setup.log"
ninja -C "$work/sub/build" >"$work/sub-ninja.log"
"$work/sub/build/consumer" "$work/subproject.safetensors"
"$work/sub/build/consumer_model"
