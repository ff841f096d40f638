/* --config FILE (src/cli/config.c) through train's parser (src/cli/train.c): every flag that
 * `llm3d train --help` lists, given on the command line, is written to the run's YAML
 * (config_yaml, OUT/run.yaml) and read back with --config to the same configuration and the same
 * YAML; the command line overrides the file whatever the order; each kind of bad file is refused
 * with its own one-line message. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/file.h"
#include "llm3d/train.h"
#include "test.h"

static char tmp[] = "/tmp/l3d-test-config-XXXXXX";

/* A value for every flag of train: the value (NULL: a switch) and the flags it needs beside it
 * (space-separated), chosen so that the flag changes the configuration they give alone. A new
 * flag needs its row here; one kept as a string (a path) also its field in same(). */
static const struct { const char *flag, *val, *with; } values[] = {
    {"model", "d12", ""}, {"layers", "3", ""}, {"channels", "192", ""}, {"heads", "2", ""},
    {"vocab", "300", ""}, {"context", "128", ""}, {"ffn", "512", ""},
    {"arch", "llama", "--ffn 512"}, {"kv-heads", "2", "--arch llama --ffn 512"},
    {"head-dim", "32", "--arch llama --ffn 512"},
    {"rope-theta", "20000", "--arch llama --ffn 512"}, {"norm-eps", "1e-6", ""},
    {"qk-norm", NULL, "--arch llama --ffn 512"},
    {"no-qk-norm", NULL, "--arch llama --ffn 512 --qk-norm"},
    {"moe-experts", "8", "--model moe-tiny"}, {"moe-top-k", "1", "--model moe-tiny"},
    {"moe-ffn", "256", "--model moe-tiny"}, {"moe-shared-experts", "1", "--model moe-tiny"},
    {"moe-dense-layers", "1", "--model moe-tiny"},
    {"moe-norm-topk", NULL, "--model moe-tiny --no-moe-norm-topk"},
    {"no-moe-norm-topk", NULL, "--model moe-tiny"},
    {"moe-aux-loss-coef", "0.5", "--model moe-tiny"},
    {"moe-z-loss-coef", "0.5", "--model moe-tiny"},
    {"moe-capacity-factor", "1.25", "--model moe-tiny"},
    {"moe-force-balance", NULL, "--model moe-tiny"},
    {"init-from", "@init", ""}, {"train", "a dir/train_*.bin", ""}, {"val", "v\"q\".bin", ""},
    {"sequential", NULL, ""}, {"steps", "7", ""}, {"lr", "1e-3", ""}, {"min-lr", "1e-5", ""},
    {"warmup", "3", ""}, {"weight-decay", "0.2", ""}, {"beta1", "0.8", ""},
    {"beta2", "0.99", ""}, {"eps", "1e-7", ""}, {"grad-clip", "0.5", ""}, {"tp", "2", ""},
    {"cp", "2", ""}, {"pp", "2", ""}, {"dp", "2", ""}, {"ep", "2", "--model moe-tiny"},
    {"pp-schedule", "gpipe", ""},
    {"pp-virtual", "2", "--pp 2 --grad-accum 2"}, {"pp-layers", "3,3", "--pp 2"},
    {"pp-first-layers", "2", "--pp 2"}, {"pp-last-layers", "2", "--pp 2"}, {"batch", "3", ""},
    {"seq-len", "16", ""}, {"grad-accum", "2", ""}, {"global-batch", "16", ""},
    {"zero", "1", ""}, {"zero3-prefetch", "2", "--zero 3"}, {"sequence-parallel", NULL, "--tp 2"},
    {"no-sequence-parallel", NULL, "--tp 2 --sequence-parallel"}, {"recompute", "full", ""},
    {"xent-chunk", "64", ""}, {"threads", "1", ""}, {"bucket-mb", "8", ""},
    {"precision", "bf16", ""},
    {"grad-reduce-dtype", "bf16", ""}, {"tp-reduce-dtype", "fp32", "--precision bf16 --tp 2"},
    {"cp-reduce-dtype", "fp32", ""},
    {"initial-loss-scale", "1024", "--precision fp16"},
    {"min-loss-scale", "2", "--precision fp16"}, {"loss-scale-window", "100", "--precision fp16"},
    {"hysteresis", "3", "--precision fp16"}, {"loss-scale-backoff", "0.25", "--precision fp16"},
    {"loss-scale", "128", "--precision fp16"}, {"val-every", "5", ""}, {"val-batches", "2", ""},
    {"seed", "7", ""}, {"out", "o: #1", ""}, {"save-dtype", "bf16", ""},
    {"save-shard-mb", "10", ""}, {"backend", "check", ""}, {"comm", "blocking", ""},
    {"progress", "thread", ""}, {"trace", "t.json", ""}, {"ignore-memory-check", NULL, ""},
    {"allow-cross-node-tp", NULL, ""}, {"peak-gflops", "50", ""}, {"quiet", NULL, ""},
    {"save-every", "10", "--out o"}, {"ckpt-dir", "ck", ""}, {"keep", "5", ""},
    {"resume", "auto", "--out o"}, {"overwrite", NULL, ""}, {"timeout", "30", ""},
    {"max-skipped-steps", "3", ""}, {"tensorboard", "tb", ""}, {"async-save", NULL, ""},
    {"tokenizer", "bytes", ""},
};
#define NVALUES ((int)(sizeof values / sizeof values[0]))

static char init_dir[128]; /* --init-from's model */

/* A file's text (malloc'd), NULL when unreadable. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void put(const char *path, const char *text) {
    CHECK(l3d_write_file(path, "test file", text, strlen(text)) == L3D_OK);
}

struct parsed {
    int rc;
    struct l3d_train_config tc;
    const char *backend;
    char *err, *out; /* what it wrote to stderr and stdout */
};

/* train's flags (argv[0] "train" added) with stdout and stderr kept in p->out and p->err. */
static void parse(struct parsed *p, int argc, const char **args) {
    char *argv[64] = {"train"};
    L3D_ASSERT(argc < 63);
    for (int i = 0; i < argc; i++) argv[i + 1] = (char *)args[i];
    l3d_train_config_defaults(&p->tc);
    p->backend = NULL;
    char files[2][160];
    int saved[2], fds[2] = {STDOUT_FILENO, STDERR_FILENO};
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < 2; k++) {
        snprintf(files[k], sizeof files[k], "%s/std%d", tmp, k);
        int fd = open(files[k], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        saved[k] = dup(fds[k]);
        dup2(fd, fds[k]);
        close(fd);
    }
    p->rc = l3d_cli_train_flags("train", argc + 1, argv, &p->tc, &p->backend);
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < 2; k++) dup2(saved[k], fds[k]), close(saved[k]);
    p->out = slurp(files[0]);
    p->err = slurp(files[1]);
}

static void parsed_free(struct parsed *p) {
    free((char *)p->tc.config_yaml);
    free(p->err);
    free(p->out);
}

/* Same strings, NULL only as NULL. */
static bool same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Whether two parses set the same configuration: the strings by their text (argv's or the
 * file's), everything else byte for byte (l3d_train_config_defaults zeroes the padding). */
static bool same(const struct parsed *x, const struct parsed *y) {
    struct l3d_train_config a = x->tc, b = y->tc;
    const char **sa[] = {&a.train_pattern, &a.val_pattern, &a.out_dir, &a.init_from,
                         &a.trace_path, &a.ckpt_dir, &a.resume, &a.layout.pp_layers,
                         &a.config_yaml, &a.tensorboard, &a.tokenizer};
    const char **sb[] = {&b.train_pattern, &b.val_pattern, &b.out_dir, &b.init_from,
                         &b.trace_path, &b.ckpt_dir, &b.resume, &b.layout.pp_layers,
                         &b.config_yaml, &b.tensorboard, &b.tokenizer};
    bool eq = same_str(x->backend, y->backend);
    for (size_t i = 0; i < sizeof sa / sizeof sa[0]; i++) {
        eq = eq && same_str(*sa[i], *sb[i]);
        *sa[i] = *sb[i] = NULL;
    }
    return eq && memcmp(&a, &b, sizeof a) == 0;
}

/* argv from a space-separated string, then more */
static int words(const char *s, const char **out, char *buf, size_t cap) {
    int n = 0;
    snprintf(buf, cap, "%s", s);
    for (char *t = strtok(buf, " "); t; t = strtok(NULL, " ")) out[n++] = t;
    return n;
}

/* One flag: its YAML read back sets what the command line set, and writes the same YAML. */
static void one_flag(int i) {
    const char *args[16];
    char buf[256], cfg[160];
    int n = words(values[i].with, args, buf, sizeof buf);
    struct parsed base, cli, file;
    parse(&base, n, args);
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", values[i].flag);
    args[n++] = flag;
    if (values[i].val)
        args[n++] = strcmp(values[i].val, "@init") == 0 ? init_dir : values[i].val;
    parse(&cli, n, args);
    snprintf(cfg, sizeof cfg, "%s/%s.yaml", tmp, values[i].flag);
    put(cfg, cli.tc.config_yaml ? cli.tc.config_yaml : "");
    parse(&file, 2, (const char *[]){"--config", cfg});
    bool ok = base.rc == -1 && cli.rc == -1 && file.rc == -1 && !same(&cli, &base) &&
              same(&cli, &file) && same_str(cli.tc.config_yaml, file.tc.config_yaml);
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "--%s %s: rc %d %d %d, changes the run: %d, read back the same: %d, "
                "same YAML: %d\n%s%s%s", values[i].flag, values[i].val ? values[i].val : "",
                base.rc, cli.rc, file.rc, !same(&cli, &base), same(&cli, &file),
                same_str(cli.tc.config_yaml, file.tc.config_yaml), base.err, cli.err, file.err);
    parsed_free(&base);
    parsed_free(&cli);
    parsed_free(&file);
}

/* Every flag --help lists has a value above, and each round-trips. */
static void every_flag(void) {
    struct parsed help;
    parse(&help, 1, (const char *[]){"--help"});
    CHECK(help.rc == 0);
    int listed = 0;
    for (const char *l = help.out; l && (l = strstr(l, "\n  --")); l++) {
        char name[64];
        if (sscanf(l + 5, "%63[a-z0-9-]", name) != 1 || strcmp(name, "config") == 0) continue;
        listed++;
        int k = -1;
        for (int i = 0; i < NVALUES; i++)
            if (strcmp(values[i].flag, name) == 0) k = i;
        CHECK(k >= 0);
        if (k < 0) fprintf(stderr, "--%s: no value in tests/test_config.c: add one\n", name);
        else one_flag(k);
    }
    CHECK(listed == NVALUES); /* and no value for a flag that is gone */
    CHECK(listed > 60);
    parsed_free(&help);
}

/* The command line overrides the file before or after --config; a switch's false is no flag. */
static void overrides(void) {
    char cfg[160];
    snprintf(cfg, sizeof cfg, "%s/over.yaml", tmp);
    put(cfg, "optimizer:\n  lr: 1e-3\n  steps: 9\nquiet: false\nlayout: {batch: 5}\n"
             "sequential: true\n");
    struct parsed a, b, c;
    parse(&a, 4, (const char *[]){"--lr", "2e-3", "--config", cfg});
    parse(&b, 4, (const char *[]){"--config", cfg, "--lr", "2e-3"});
    parse(&c, 0, NULL);
    CHECK(a.rc == -1 && b.rc == -1 && same(&a, &b));
    CHECK(a.tc.lr == 2e-3f && a.tc.steps == 9 && a.tc.layout.micro_batch == 5);
    CHECK(!a.tc.quiet && c.tc.random_batches && !a.tc.random_batches);
    CHECK(strstr(a.tc.config_yaml, "  lr: 2e-3\n") && strstr(a.tc.config_yaml, "# quiet: false"));
    parsed_free(&a);
    parsed_free(&b);
    parsed_free(&c);
}

/* Each bad file: status 2 and its one line, which names the file's line. */
static void refuses(const char *yaml, const char *want) {
    char cfg[160];
    snprintf(cfg, sizeof cfg, "%s/bad.yaml", tmp);
    put(cfg, yaml);
    struct parsed p;
    parse(&p, 2, (const char *[]){"--config", cfg});
    bool ok = p.rc == 2 && p.err && strstr(p.err, want) && strchr(p.err, '\n') == strrchr(p.err, '\n');
    CHECK(ok);
    if (!ok) fprintf(stderr, "%s: rc %d, wanted '%s', said: %s\n", yaml, p.rc, want, p.err);
    parsed_free(&p);
}

static void bad_files(void) {
    refuses("optimizer:\n  lerning-rate: 1\n", "unknown key 'lerning-rate' in ");
    refuses("optimizer:\n  lerning-rate: 1\n", "bad.yaml line 2: did you mean 'lr'?");
    refuses("layout:\n  wramup: 1\n", "did you mean 'warmup' (in section 'optimizer:')?");
    refuses("zzz: 1\n", "unknown key 'zzz' in");
    refuses("modle:\n  layers: 2\n", "unknown section 'modle:' in");
    refuses("layout:\n\n  lr: 1e-3\n", "line 3: 'lr' belongs in section 'optimizer:', not in "
                                       "section 'layout:'");
    refuses("optimizer:\n  lr: abc\n", "bad.yaml line 2: --lr 'abc' is not a number");
    refuses("layout:\n  tp: 0\n", "line 2: --tp 0 is out of range");
    refuses("optimizer:\n  lr: 1\n  steps: 2\n  lr: 2\n", "'lr' is given twice, on lines 2 and 4");
    refuses("lr: 1\noptimizer:\n  lr: 2\n", "'lr' is given twice, on lines 1 and 3");
    refuses("model:\n  layers: 2\nmodel:\n  heads: 2\n", "section 'model:' is given twice");
    refuses("optimizer:\n  lr: 1\n warmup: [\n", "line 3 column 2: YAML syntax: ");
    refuses("lr: [1, 2\n", "YAML syntax");
    refuses("- lr\n- 1\n", "the file is a list, not a mapping of flags");
    refuses("just text\n", "the file is a value, not a mapping of flags");
    refuses("lr: 1\n---\nlr: 2\n", "more than one document");
    refuses("quiet: maybe\n", "line 1: --quiet is a switch: give quiet: true or quiet: false");
    refuses("optimizer:\n  lr:\n", "line 2: lr takes one value, not nothing");
    refuses("optimizer:\n  lr: [1]\n", "lr takes one value, not a list");
    refuses("lr: {x: 1}\n", "line 1: lr takes one value, not a mapping");
    refuses("optimizer:\n  [lr]: 1\n", "line 2: a key is a list");
    refuses("? {a: 1}\n: 2\n", "line 1: a key is a mapping");
    refuses("model:\n  hidden: 64\n", "line 2: --hidden is now --channels");
    struct parsed p; /* an empty file, or comments only: no flags */
    char cfg[160];
    snprintf(cfg, sizeof cfg, "%s/empty.yaml", tmp);
    put(cfg, "# nothing\n");
    parse(&p, 2, (const char *[]){"--config", cfg});
    CHECK(p.rc == -1);
    parsed_free(&p);
    parse(&p, 4, (const char *[]){"--config", cfg, "--config", cfg});
    CHECK(p.rc == 2 && strstr(p.err, "--config is given twice"));
    parsed_free(&p);
    parse(&p, 2, (const char *[]){"--config", tmp});
    CHECK(p.rc == 2 && strstr(p.err, "cannot read it: a directory"));
    parsed_free(&p);
    snprintf(cfg, sizeof cfg, "%s/none.yaml", tmp);
    parse(&p, 2, (const char *[]){"--config", cfg});
    CHECK(p.rc == 2 && strstr(p.err, "none.yaml: cannot read it: No such file"));
    parsed_free(&p);
}

/* The comparison the round trip rests on tells a changed value and a changed string apart. */
static void same_can_fail(void) {
    struct parsed a, b;
    parse(&a, 2, (const char *[]){"--train", "x"});
    parse(&b, 2, (const char *[]){"--train", "x"});
    CHECK(same(&a, &b));
    b.tc.adamw.beta2 = 0.5f;
    CHECK(!same(&a, &b));
    b.tc.adamw.beta2 = a.tc.adamw.beta2;
    b.tc.train_pattern = "y";
    CHECK(!same(&a, &b));
    parsed_free(&a);
    parsed_free(&b);
}

int main(void) {
    L3D_ASSERT(mkdtemp(tmp));
    /* --init-from's model: a tiny llm.c checkpoint (zeros) */
    snprintf(init_dir, sizeof init_dir, "%s/init.bin", tmp);
    struct l3d_model_spec m;
    L3D_ASSERT(l3d_model_preset(&m, "tiny") == L3D_OK);
    m.V = 256;
    m.maxT = 32;
    L3D_ASSERT(l3d_gpt_config_finish(&m) == L3D_OK);
    int64_t np = l3d_gpt_param_count(&m);
    float *zeros = calloc((size_t)np, sizeof(float));
    CHECK(l3d_ckpt_save_llmc_params(init_dir, &m, zeros, np) == L3D_OK);
    free(zeros);
    same_can_fail();
    every_flag();
    overrides();
    bad_files();
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
    return TEST_REPORT();
}
