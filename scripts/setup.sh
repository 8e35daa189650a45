#!/usr/bin/env bash
# Installs longtron's build dependencies from Debian's packages (when missing) and builds it.
# Usage: scripts/setup.sh [build-dir] [extra cmake args...]
# SETUP_TARGETS="a b" builds only those targets (scripts/demo.sh: longtron); default: everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; shift || true

PACKAGES=(cmake g++ make pkg-config libopenmpi-dev openmpi-bin libopenblas-dev
  libsentencepiece-dev sentencepiece libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libfmt-dev libgtest-dev libbenchmark-dev zlib1g-dev libdnnl-dev ocl-icd-opencl-dev
  libpcre2-dev libicu-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm (to fetch the demo corpus) may come from Debian's npm package or with a nodejs build.
command -v npm > /dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@" > /dev/null
# shellcheck disable=SC2086  # the target list splits on spaces
cmake --build "$BUILD_DIR" -j "$(nproc)" ${SETUP_TARGETS:+--target $SETUP_TARGETS}
