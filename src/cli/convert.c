/* llm3d convert: a training checkpoint's weights as one llm.c GPT-2 file (include/llm3d/ckpt.h). */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d convert CHECKPOINT OUT.bin\n"
        "Writes the weights of CHECKPOINT (a step directory of llm3d train --save-every, or a\n"
        "checkpoint directory, whose `latest` is used), saved under any layout, as one llm.c GPT-2\n"
        "checkpoint (magic 20240326, version 3, fp32): llm.c's train_gpt2 and llm3d generate read\n"
        "it. The other way, an llm.c checkpoint starts an llm3d run with train --init-from FILE.\n");
}

int l3d_cli_convert(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "llm3d convert: see llm3d convert --help\n");
        return 2;
    }
    if (argc - optind != 2) {
        fprintf(stderr, "llm3d convert: give a checkpoint and an output file (see --help)\n");
        return 2;
    }
    const char *src = argv[optind], *dst = argv[optind + 1];
    char dir[4096];
    l3d_status st = l3d_ckpt_resolve(src, NULL, dir, sizeof dir);
    struct l3d_gpt_config cfg;
    int64_t step = 0;
    if (st == L3D_OK) st = l3d_ckpt_read_config(dir, &cfg, &step);
    if (st == L3D_OK) st = l3d_ckpt_export_llmc(dir, dst);
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d convert: %s\n", l3d_error_message());
        return 1;
    }
    printf("%s: step %lld, L=%d C=%d NH=%d V=%d context=%d -> %s (llm.c fp32)\n", dir,
           (long long)step, cfg.L, cfg.C, cfg.NH, cfg.V, cfg.maxT, dst);
    return 0;
}
