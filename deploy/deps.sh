#!/usr/bin/env bash
# Sourced by the top-level commands: installs the Debian packages the build
# needs (as root), or prints the exact apt-get line and stops (as a user).
PS_DEBIAN_PACKAGES="build-essential autoconf automake libtool pkg-config \
libzmq3-dev libprotobuf-c-dev protobuf-c-compiler liblz4-dev libuv1-dev \
libopenblas-dev libcjson-dev libjpeg62-turbo-dev libavformat-dev libavcodec-dev \
libswscale-dev libavutil-dev libdnnl-dev procps"

# The packages among "$@" that are not installed, on one line.
ps_missing_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    echo "${missing[*]}"
}

ps_apt_install() {
    echo "installing: $*" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

# The build's packages (and "$@"): installed as root; as a user, the exact
# apt-get line and exit 1.
ps_ensure_packages() {
    local missing
    # shellcheck disable=SC2086 # a list of names
    missing=$(ps_missing_packages $PS_DEBIAN_PACKAGES "$@")
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "missing Debian packages; run as root:" >&2
        echo "  apt-get update && apt-get install -y $missing" >&2
        exit 1
    fi
    # shellcheck disable=SC2086
    ps_apt_install $missing || { echo "apt-get install failed" >&2; exit 1; }
}

# Packages a script can do without (gnuplot for the plots): installed as
# root; as a user, a note with the apt-get line, and 1 (the caller goes on).
ps_want_packages() {
    local missing
    missing=$(ps_missing_packages "$@")
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "note: $missing not installed (as root: apt-get install -y $missing)" >&2
        return 1
    fi
    # shellcheck disable=SC2086
    ps_apt_install $missing || { echo "apt-get install $missing failed: going on without" >&2; return 1; }
}

# Configure (once) and build in the source tree.
ps_build() {
    [ -x ./configure ] || autoreconf -fi >/dev/null || { echo "autoreconf failed" >&2; exit 1; }
    [ -f Makefile ] || ./configure --quiet ${PS_CONFIGURE_FLAGS:-} || { echo "configure failed" >&2; exit 1; }
    # BUILT_SOURCES (the protobuf-c code) is made first only by `make all`:
    # named targets built in parallel would race its header.
    if [ -n "${PS_MAKE_TARGETS:-}" ]; then
        make proto/ps.pb-c.h || { echo "build failed (protobuf-c code)" >&2; exit 1; }
    fi
    make -j"$(nproc)" ${PS_MAKE_TARGETS:-} || { echo "build failed" >&2; exit 1; }
}

# Run directly (./deploy/deps.sh): just install the packages.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -eu
    ps_ensure_packages "$@"
    echo "all build dependencies are installed"
fi
