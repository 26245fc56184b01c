#!/usr/bin/env bash
# Installs what moe8 needs to build and test, from Debian's packages, when
# it is missing.  Used by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libcjson-dev libcmocka-dev libopenblas-dev libopenmpi-dev openmpi-bin python3-numpy python3-pytest python3-pip python3-setuptools python3-venv python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
