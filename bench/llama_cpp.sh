# Sourced by the benchmarks that compare with llama.cpp: builds the given
# targets of llama.cpp from the llama-cpp-python source package on PyPI
# (vendor/llama.cpp), with CMake, outside the repository, once:
#   llama_cpp_build TARGET...   sets llama_bin to the directory of the programs
# MPQ_LLAMA_DIR (default ~/.cache/mpq-llama.cpp) holds the package, the
# sources and the build; GGML_NATIVE=ON: ggml compiled for this CPU, less
# AMX (-mno-amx-*: virtual machines that list AMX in /proc/cpuinfo without
# enabling its tile state kill ggml's AMX and repacked paths with SIGILL, and
# mpq has no AMX path to compare with). With
# llama_isa=avx2 set before sourcing, a second build (build-avx2) has
# GGML_NATIVE=OFF, whose defaults are the instructions of an AVX2 machine
# (SSE4.2, AVX, AVX2, BMI2, FMA, F16C; no AVX-512).
llama_version=0.3.36
llama=${MPQ_LLAMA_DIR:-$HOME/.cache/mpq-llama.cpp}
llama_isa=${llama_isa:-native}
case "$llama_isa" in
native) llama_build="$llama/build-native" llama_native=ON llama_cflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
avx2) llama_build="$llama/build-avx2" llama_native=OFF llama_cflags="" ;;
*) echo "llama_isa must be native or avx2" >&2; return 1 ;;
esac
llama_bin="$llama_build/bin"

llama_cpp_build() {
    local missing=0 t
    for t in "$@"; do [ -x "$llama_bin/$t" ] || missing=1; done
    [ "$missing" -eq 0 ] && return 0
    echo "building llama.cpp (llama-cpp-python $llama_version from PyPI) in $llama: $*"
    command -v cmake >/dev/null || { echo "needs cmake (Debian: cmake)" >&2; return 1; }
    mkdir -p "$llama"
    local tarball="$llama/llama_cpp_python-$llama_version.tar.gz"
    if [ ! -f "$tarball" ]; then
        [ -x build/venv/bin/pip ] || python3 -m venv build/venv
        build/venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
            "llama-cpp-python==$llama_version" -d "$llama"
    fi
    [ -d "$llama/src" ] || { mkdir -p "$llama/src" && tar xzf "$tarball" -C "$llama/src" --strip-components=1; }
    cmake -S "$llama/src/vendor/llama.cpp" -B "$llama_build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=$llama_native \
        -DCMAKE_C_FLAGS="$llama_cflags" -DCMAKE_CXX_FLAGS="$llama_cflags" \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$llama_build" -j "$(nproc)" --target "$@" >/dev/null
}
