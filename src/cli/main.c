/* llm3d: the command-line entry point; one function per command (src/cli/cli.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *what;
} commands[] = {
    {"train", l3d_cli_train, "train a GPT on token shards"},
    {"generate", l3d_cli_generate, "sample text from a checkpoint"},
    {"prepare", l3d_cli_prepare, "turn text files into token shards"},
    {"tokenizer", l3d_cli_tokenizer, "train a BPE vocabulary; encode text, decode shards"},
    {"bench", l3d_cli_bench, "measure this machine's peak and a model's training throughput"},
    {"compare", l3d_cli_compare, "check that two runs trained the same model (losses, weights)"},
    {"plan", l3d_cli_plan, "predict memory and step time of layouts on a system; the best first"},
    {"convert", l3d_cli_convert, "write a training checkpoint's weights as an llm.c checkpoint"},
    {"plot", l3d_cli_plot, "draw loss curves, a pipeline timeline or benchmark data as SVG"},
    {"inspect", l3d_cli_inspect, "say what a shard, checkpoint or run directory holds, checked"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: llm3d <command> [flags]   (llm3d <command> --help for its flags)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].what);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "llm3d: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
