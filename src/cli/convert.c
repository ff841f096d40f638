/* llm3d convert: a training checkpoint's weights as one llm.c GPT-2 file (include/llm3d/ckpt.h). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d convert CHECKPOINT OUT.bin [--precision fp32|bf16]\n"
        "Writes the weights of CHECKPOINT (a step directory of llm3d train --save-every, or a\n"
        "checkpoint directory, whose `latest` is used), saved under any layout and precision, as\n"
        "one llm.c GPT-2 checkpoint (magic 20240326): version 3 (fp32, the default) or with\n"
        "--precision bf16 version 5 (llm.c's bf16 file: the fp32 master weights rounded to\n"
        "nearest even). llm.c's train_gpt2 and llm3d generate read both. The other way, an llm.c\n"
        "checkpoint (either version) starts an llm3d run with train --init-from FILE.\n");
}

int l3d_cli_convert(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"precision", required_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    int c;
    enum l3d_dtype dt = L3D_F32;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == 'p' && (strcmp(optarg, "fp32") == 0 || strcmp(optarg, "bf16") == 0)) {
            dt = strcmp(optarg, "bf16") == 0 ? L3D_BF16 : L3D_F32;
            continue;
        }
        if (c == 'p')
            fprintf(stderr, "llm3d convert: --precision '%s': choose fp32 (llm.c version 3) or "
                    "bf16 (version 5)\n", optarg);
        else
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
    struct l3d_model_spec cfg;
    int64_t step = 0;
    if (st == L3D_OK) st = l3d_ckpt_read_config(dir, &cfg, &step);
    if (st == L3D_OK) st = l3d_ckpt_export_llmc_dt(dir, dst, dt);
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d convert: %s\n", l3d_error_message());
        return 1;
    }
    printf("%s: step %lld, L=%d C=%d NH=%d V=%d context=%d -> %s (llm.c %s)\n", dir,
           (long long)step, cfg.L, cfg.C, cfg.NH, cfg.V, cfg.maxT, dst,
           dt == L3D_BF16 ? "bf16, version 5" : "fp32, version 3");
    return 0;
}
