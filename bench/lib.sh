# Shared by the benchmark scripts (sourced after build=BUILD_DIR is set; bench/cluster_lib.sh
# sources it for the cluster ones):
#   bench_mpi    sets bin (the build's llm3d), mpiexec (the launcher in its CMake cache) and dir (a
#                temporary folder, removed on exit), and lets Open MPI run as root;
#   fortunes OUT prepares the fortunes corpus as byte tokens in OUT (the step times do not
#                depend on the data);
#   median       of the numbers on stdin, one a line;
#   med FIELD FILE [SKIP]  the median of a numeric field of metrics.jsonl FILE over the steps after
#                the first SKIP (2).

bench_mpi() {
    bin=$build/llm3d
    mpiexec=$(grep -E '^MPIEXEC_EXECUTABLE:' "$build/CMakeCache.txt" | cut -d= -f2)
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

fortunes() {
    "$bin" prepare --tokenizer bytes --out "$1" /usr/share/games/fortunes/fortunes \
        /usr/share/games/fortunes/literature /usr/share/games/fortunes/science > /dev/null
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

med() {
    grep -o "\"$1\":[0-9.e+-]*" "$2" | tail -n +$((${3:-2} + 1)) | cut -d: -f2 | median
}
