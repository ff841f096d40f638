#!/usr/bin/env bash
# Installs the Debian packages llm3d needs, only those that are missing. Idempotent.
#   build:    gcc, make, cmake, OpenMP (libgomp ships with gcc)
#   math:     oneDNN (libdnnl-dev): sgemm and bf16 matmul sharing the OpenMP pool (see docs/DESIGN.md)
#   parallel: Open MPI (libopenmpi-dev, openmpi-bin), the default build (-DL3D_MPI=openmpi), and
#             MPICH (mpich, libmpich-dev) for -DL3D_MPI=mpich. Debian installs both side by side;
#             the build names each flavour's own wrapper and launcher (mpicc.<flavour>,
#             mpiexec.<flavour>), so whichever /usr/bin/mpicc points at does not matter.
#   data:     the fortunes package's text files, the demo's default corpus
set -euo pipefail
pkgs=(gcc make cmake libdnnl-dev libopenmpi-dev openmpi-bin mpich libmpich-dev fortunes fortunes-min libpcre2-dev)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: packages ${missing[*]} are missing and this user is not root; install them as root with apt-get" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
