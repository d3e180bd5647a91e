#!/usr/bin/env bash
# Installs what fmoe needs to build and test on Debian 12: the C libraries, meson, the
# HDF5 command-line tools, SIMDe's headers (the emulated AVX-512 kernel tests,
# lib/simd512.h), and Python's venv (the Python test packages come from PyPI in
# tests/run-all.sh). Run as root, or as a user with sudo.
set -euo pipefail
packages=(
  build-essential meson ninja-build pkg-config
  libhdf5-dev hdf5-tools libzstd-dev libopenblas-dev libcjson-dev libmicrohttpd-dev
  libpcre2-dev zstd
  libsimde-dev
  libopenmpi-dev openmpi-bin
  python3 python3-venv python3-pip
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all Debian packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
