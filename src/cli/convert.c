/* llm3d convert: a training checkpoint's weights as one llm.c GPT-2 file (include/llm3d/ckpt.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/spec.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d convert CHECKPOINT OUT.bin [--precision fp32|bf16]\n"
        "\n"
        "Writes the weights of CHECKPOINT (a step directory of llm3d train --save-every, or a\n"
        "checkpoint directory, whose `latest` is used), saved under any layout and precision, as\n"
        "one llm.c GPT-2 checkpoint (magic 20240326). llm.c's train_gpt2 and llm3d generate read\n"
        "it. The other way, an llm.c checkpoint (either version) starts an llm3d run with train\n"
        "--init-from FILE.\n"
        "\n");
}

enum { C_PREC };

static const struct l3d_flag convert_flags[] = {
    {"precision", "P", C_PREC, "fp32 (default): llm.c version 3; bf16: version 5, llm.c's bf16 "
                               "file (the fp32 master weights rounded to nearest even). llm.c "
                               "has no fp16 file"},
    {NULL, NULL, 0, NULL},
};

static int set_convert(void *ctx, const char *cmd, int id, const char *v) {
    enum l3d_dtype *dt = ctx;
    struct l3d_precision p = {0};
    if (id != C_PREC) return 0;
    if (l3d_precision_parse(v, &p) != L3D_OK) {
        fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
        return 0;
    }
    if (p.param == L3D_F16) {
        fprintf(stderr, "llm3d %s: --precision fp16: llm.c's checkpoint files hold fp32 (version "
                "3) or bf16 (version 5), not fp16: give --precision fp32 or bf16\n", cmd);
        return 0;
    }
    *dt = p.param;
    return 1;
}

int l3d_cli_convert(int argc, char **argv) {
    enum l3d_dtype dt = L3D_F32;
    const struct l3d_flag_group g = {NULL, convert_flags, set_convert, &dt};
    int first = 0;
    int rc = l3d_flags_parse("convert", argc, argv, &g, 1, usage, &first);
    if (rc >= 0) return rc;
    if (argc - first != 2) {
        fprintf(stderr, "llm3d convert: give a checkpoint and an output file (see --help)\n");
        return 2;
    }
    const char *src = argv[first], *dst = argv[first + 1];
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
    printf("%s: step %lld, L=%d C=%d NH=%d V=%d context=%d -> %s (llm.c %s %d)\n", dir,
           (long long)step, cfg.L, cfg.C, cfg.NH, cfg.V, cfg.maxT, dst,
           dt == L3D_BF16 ? "bf16, version" : "fp32, version",
           l3d_model_is_gpt2(&cfg) ? (dt == L3D_BF16 ? 5 : 3) : (dt == L3D_BF16 ? 1005 : 1003));
    return 0;
}
