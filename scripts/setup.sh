#!/usr/bin/env bash
# Installs every build and runtime dependency of Tessera with apt.
# Idempotent: packages already present are not touched, and a machine that
# already has everything does not reach the network at all.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libzmq3-dev cppzmq-dev libsodium-dev
  libprotobuf-dev protobuf-compiler
  libibverbs-dev librdmacm-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  librocksdb-dev
  libabsl-dev libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev
  python3-yaml python3-numpy python3-pytest python3-matplotlib
  python3-pybind11 pybind11-dev python3-torch
  openmpi-bin slurm-wlm munge openssh-server openssh-client iproute2
  etcd-server etcd-client
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
