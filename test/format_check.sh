#!/usr/bin/env bash
# Every C, C++ and CUDA source follows .clang-format (120 columns; the
# layout the code had before the file existed). mpq_unicode.h is generated
# data and left as tools/gen_unicode.py writes it. clang-format 14 is the
# version pinned: other versions lay out a few constructs differently.
# To reformat: clang-format-14 -i $(git ls-files '*.c' '*.h' '*.cu' '*.cpp' | grep -v mpq_unicode.h)
set -eu
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format) || { echo "clang-format not found"; exit 1; }
"$fmt" --version
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cpp' | grep -v '^mpq_unicode\.h$')
else
    mapfile -t files < <(find . -path ./build -prune -o -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
        -o -name '*.cpp' \) ! -name mpq_unicode.h -print | sed 's|^\./||' | sort)
fi
echo "${#files[@]} files"
"$fmt" --dry-run --Werror "${files[@]}"
