# Sourced by the benchmarks that compare with llama.cpp: builds the given
# targets of llama.cpp from the llama-cpp-python source package on PyPI
# (vendor/llama.cpp), with CMake, outside the repository, once:
#   llama_cpp_build TARGET...   sets llama_bin to the directory of the programs
# MPQ_LLAMA_DIR (default ~/.cache/mpq-llama.cpp) holds the package, the
# sources and the build; GGML_NATIVE=ON: ggml compiled for this CPU.
llama_version=0.3.36
llama=${MPQ_LLAMA_DIR:-$HOME/.cache/mpq-llama.cpp}
llama_bin="$llama/build/bin"

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
    cmake -S "$llama/src/vendor/llama.cpp" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$llama/build" -j "$(nproc)" --target "$@" >/dev/null
}
