# util/need.sh - sourced by the scripts that install what they need
# (test/run.sh, examples/run.sh, test/gpu/run_device.sh).
#   need_debs PKG...   installs the Debian packages that are missing
#                      (apt-get, through sudo when not root); fails when
#                      apt-get does
need_debs() {
    local need=() p sudo=""
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "installing: ${need[*]}"
    $sudo apt-get update -qq >/dev/null &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}
