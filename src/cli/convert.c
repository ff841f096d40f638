/* llm3d convert: a model between its files: a training checkpoint, an llm.c GPT-2 file and a
 * Hugging Face folder in; an llm.c file or a Hugging Face folder out (include/llm3d/ckpt.h,
 * include/llm3d/hf.h). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/hf.h"
#include "llm3d/spec.h"
#include "llm3d/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d convert SOURCE DEST [--precision fp32|bf16|fp16] [--save-shard-mb M]\n"
        "                     [--tokenizer SPEC] [--overwrite]\n"
        "\n"
        "Writes the weights of SOURCE as DEST. SOURCE: a training checkpoint (a step directory\n"
        "of llm3d train --save-every, or a checkpoint directory, whose `latest` is used) saved\n"
        "under any layout and precision; an llm.c GPT-2 file (either version); or a Hugging Face\n"
        "folder (config.json + model.safetensors or its index; gpt2, llama or mixtral). DEST:\n"
        "a path ending in .bin is one llm.c GPT-2 checkpoint (magic 20240326), which llm.c's\n"
        "train_gpt2 and llm3d generate read; any other path is a Hugging Face folder\n"
        "(config.json + model.safetensors, sharded with an index above --save-shard-mb), which\n"
        "transformers' from_pretrained and llm3d --init-from read. A model already at DEST is\n"
        "replaced only with --overwrite, whole: the new one is written beside it and put in its\n"
        "place in one step (the folder's other files kept), so DEST holds the old model or the\n"
        "new one, never a mix. A folder DEST also gets the tokenizer as Hugging Face's files\n"
        "(tokenizer.json, tokenizer_config.json, special_tokens_map.json,\n"
        "generation_config.json): --tokenizer's, else SOURCE's tokenizer.json when SOURCE is\n"
        "a folder holding one; with neither, the model only (said in one line).\n"
        "\n");
}

enum { C_PREC, C_SHARD, C_OVERWRITE, C_TOK };

struct convert_opts {
    enum l3d_dtype dt;
    int64_t shard_bytes;
    bool overwrite;
    const char *tokenizer;
};

static const struct l3d_flag convert_flags[] = {
    {"precision", "P", C_PREC, "fp32 (default); bf16 (llm.c: version 5, its bf16 file; "
                               "safetensors BF16), the fp32 weights rounded to nearest even; "
                               "fp16 (safetensors F16 only: llm.c has no fp16 file)"},
    {"save-shard-mb", "M", C_SHARD, "a Hugging Face folder's weights above M MiB go to several "
                                    "files and an index (4096)"},
    {"tokenizer", "SPEC", C_TOK, "the tokenizer a folder DEST gets (see above), as prepare takes "
                                 "it"},
    {"overwrite", NULL, C_OVERWRITE, "replace a model already at DEST (an llm.c file, or a "
                                     "folder's config.json and safetensors files)"},
    {NULL, NULL, 0, NULL},
};

static int set_convert(void *ctx, const char *cmd, int id, const char *v) {
    struct convert_opts *o = ctx;
    if (id == C_TOK) {
        o->tokenizer = v;
        return 1;
    }
    if (id == C_OVERWRITE) {
        o->overwrite = true;
        return 1;
    }
    if (id == C_SHARD) {
        double mb = 0;
        if (!l3d_arg_double(cmd, "save-shard-mb", v, 1e-6, 1 << 30, &mb)) return 0;
        o->shard_bytes = (int64_t)(mb * 1048576.0);
        return 1;
    }
    return l3d_arg_precision(cmd, v, &o->dt);
}

/* SOURCE's config and full fp32 weights (l3d_free them); *what says which kind it was. */
static l3d_status read_source(const char *src, struct l3d_model_spec *cfg, float **full,
                              const char **what, char *dir, size_t cap) {
    struct stat sb;
    l3d_status st;
    *full = NULL;
    snprintf(dir, cap, "%s", src);
    if (l3d_hf_is_folder(src)) {
        *what = "Hugging Face folder";
        st = l3d_hf_config_read(src, cfg);
        if (st != L3D_OK) return st;
        *full = l3d_try_alloc((size_t)l3d_gpt_param_count(cfg) * sizeof(float), "model");
        if (!*full) return l3d_error(L3D_ERR_OOM, "%s: no memory for its weights", src);
        return l3d_hf_load(src, cfg, *full);
    }
    if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) {
        *what = "llm.c file";
        st = l3d_ckpt_read_llmc_config(src, cfg);
        if (st != L3D_OK) return st;
        *full = l3d_try_alloc((size_t)l3d_gpt_param_count(cfg) * sizeof(float), "model");
        if (!*full) return l3d_error(L3D_ERR_OOM, "%s: no memory for its weights", src);
        return l3d_ckpt_read_llmc_full(src, cfg, *full);
    }
    *what = "training checkpoint";
    st = l3d_ckpt_resolve(src, NULL, dir, cap);
    return st == L3D_OK ? l3d_ckpt_read_full(dir, cfg, full) : st;
}

/* The tokenizer a folder DEST gets into *tok (NULL: none, said in one line). Returns -1 to go on,
 * else the exit status. */
static int dest_tokenizer(const struct convert_opts *o, const char *src, const char *dst,
                          bool llmc, struct l3d_tokenizer **tok) {
    char path[4200];
    struct stat sb;
    const char *spec = o->tokenizer;
    *tok = NULL;
    if (llmc && spec) {
        fprintf(stderr, "llm3d convert: --tokenizer: an llm.c file DEST (%s) holds no tokenizer: "
                "give a folder DEST, or leave --tokenizer out\n", dst);
        return 2;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", src);
    if (!spec && !llmc && l3d_hf_is_folder(src) && stat(path, &sb) == 0) spec = path;
    if (!spec) {
        if (!llmc)
            printf("llm3d convert: no tokenizer known (give --tokenizer SPEC): %s gets the model "
                   "only\n", dst);
        return -1;
    }
    if (l3d_tokenizer_open(tok, spec) != L3D_OK) {
        fprintf(stderr, "llm3d convert: --tokenizer %s: %s\n", spec, l3d_error_message());
        return 2;
    }
    return -1;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

int l3d_cli_convert(int argc, char **argv) {
    struct convert_opts o = {L3D_F32, 0, false, NULL};
    const struct l3d_flag_group g = {NULL, convert_flags, set_convert, &o};
    int first = 0;
    int rc = l3d_flags_parse_n("convert", argc, argv, &g, usage, 2, "a source and a destination",
                               &first);
    if (rc >= 0) return rc;
    const char *src = argv[first], *dst = argv[first + 1], *what = "";
    const bool llmc = ends_with(dst, ".bin");
    if (llmc && o.dt == L3D_F16) {
        fprintf(stderr, "llm3d convert: --precision fp16: llm.c's checkpoint files hold fp32 "
                "(version 3) or bf16 (version 5), not fp16: give --precision fp32 or bf16, or a "
                "folder (not *.bin) for safetensors F16\n");
        return 2;
    }
    struct stat sb;
    if (!o.overwrite && (llmc ? stat(dst, &sb) == 0 : l3d_hf_has_model(dst))) {
        fprintf(stderr, "llm3d convert: %s already holds a model: give --overwrite to replace it "
                "(%s), or another DEST\n", dst, llmc ? "the file" : "its config.json and "
                "safetensors files; the folder's other files are kept");
        return 2;
    }
    struct l3d_tokenizer *tok;
    if ((rc = dest_tokenizer(&o, src, dst, llmc, &tok)) >= 0) return rc;
    struct l3d_model_spec cfg;
    float *full = NULL;
    char dir[4096];
    l3d_status st = read_source(src, &cfg, &full, &what, dir, sizeof dir);
    if (st == L3D_OK && llmc)
        st = l3d_ckpt_save_llmc_params_dt(dst, &cfg, full, l3d_gpt_param_count(&cfg), o.dt);
    else if (st == L3D_OK)
        st = l3d_hf_save_tok(dst, &cfg, full, o.dt, o.shard_bytes > 0 ? o.shard_bytes
                                                                     : L3D_HF_SHARD_BYTES, tok);
    l3d_free(full);
    l3d_tokenizer_free(tok);
    if (st != L3D_OK) return l3d_cli_failed("convert");
    char ver[40];
    snprintf(ver, sizeof ver, "%s, version %d", o.dt == L3D_BF16 ? "bf16" : "fp32",
             l3d_model_is_gpt2(&cfg) ? (o.dt == L3D_BF16 ? 5 : 3)
                                     : (o.dt == L3D_BF16 ? 1005 : 1003));
    printf("%s (%s): L=%d C=%d NH=%d V=%d context=%d -> %s (%s %s)\n", dir, what, cfg.L, cfg.C,
           cfg.NH, cfg.V, cfg.maxT, dst, llmc ? "llm.c" : "Hugging Face folder",
           llmc ? ver : l3d_dtype_name(o.dt));
    return 0;
}
