/* Run directories (src/train/train-impl.h, l3d_train_run_claim): a run's id, the directory's
 * `run` file, refusing to start over an earlier run, --overwrite, and no output over an input. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/ckpt.h"
#include "llm3d/file.h"
#include "llm3d/hf.h"
#include "train/train-impl.h"

#define RUN_MAGIC "llm3d-run 1"

static uint64_t new_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)getpid() << 32);
    }
    return id ? id : 1; /* 0 means "none" in manifests */
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The run file: "llm3d-run 1", "id HEX", "model L C NH V maxT". false when absent or unreadable. */
static bool read_run(const char *path, uint64_t *id, struct l3d_model_spec *cfg) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[256];
    bool magic = false, have_id = false, have_model = false;
    unsigned long long x;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, RUN_MAGIC, strlen(RUN_MAGIC)) == 0) magic = true;
        if (sscanf(line, "id %llx", &x) == 1) *id = x, have_id = true;
        if (sscanf(line, "model L %d C %d NH %d V %d maxT %d", &cfg->L, &cfg->C, &cfg->NH,
                   &cfg->V, &cfg->maxT) == 5)
            have_model = true;
    }
    fclose(f);
    return magic && have_id && have_model;
}

/* Written whole through the file writer (include/llm3d/file.h). */
static l3d_status write_run(const char *path, uint64_t id, const struct l3d_model_spec *c) {
    char text[256];
    int n = snprintf(text, sizeof text, "%s\nid %016" PRIx64 "\nmodel L %d C %d NH %d V %d maxT %d\n",
                     RUN_MAGIC, id, c->L, c->C, c->NH, c->V, c->maxT);
    L3D_ASSERT(n > 0 && (size_t)n < sizeof text);
    return l3d_write_file(path, "run file", text, (size_t)n);
}

/* "L 2 (flags: 4), C ..." for the sizes in which a differs from b; "" when none. */
static void differences(const struct l3d_model_spec *a, const struct l3d_model_spec *b, char *out,
                        size_t cap) {
    const char *names[5] = {"--layers", "--channels", "--heads", "--vocab", "--context"};
    int x[5] = {a->L, a->C, a->NH, a->V, a->maxT}, y[5] = {b->L, b->C, b->NH, b->V, b->maxT};
    size_t k = 0;
    out[0] = '\0';
    for (int i = 0; i < 5 && k < cap; i++)
        if (x[i] != y[i])
            k += (size_t)snprintf(out + k, cap - k, "%s%s %d (the run's: %d)", k ? ", " : "",
                                  names[i], y[i], x[i]);
}

static bool same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* The files a run writes in --out. */
static const char *const outs[3] = {"model.bin", "metrics.jsonl", "run"};

/* Outputs never replace an input: the model to start from (same device and inode). */
static l3d_status no_output_over_input(const struct l3d_train_config *tc) {
    char p[4200];
    for (int i = 0; tc->out_dir && tc->init_from && i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", tc->out_dir, outs[i]);
        if (same_file(tc->init_from, p))
            return l3d_error(L3D_ERR_ARG, "--init-from %s is the %s that --out %s writes: the run "
                             "would overwrite the model it starts from; give another --out (or "
                             "copy the model elsewhere first)", tc->init_from, outs[i],
                             tc->out_dir);
    }
    if (tc->out_dir && tc->init_from && same_file(tc->init_from, tc->out_dir))
        return l3d_error(L3D_ERR_ARG, "--init-from %s is the folder --out writes config.json and "
                         "model.safetensors into: the run would overwrite the model it starts "
                         "from; give another --out", tc->init_from);
    if (tc->trace_path && tc->init_from && same_file(tc->trace_path, tc->init_from))
        return l3d_error(L3D_ERR_ARG, "--trace %s is the --init-from model: give another path",
                         tc->trace_path);
    /* written at the end: what cannot be replaced is said before training */
    if (tc->trace_path && l3d_out_check(tc->trace_path, "--trace file") != L3D_OK)
        return L3D_ERR_ARG;
    return L3D_OK;
}

/* --overwrite's removal of what an earlier run left (found names it): outs, the Hugging Face
 * model's files (hf), the checkpoints' latest and step directories. */
static l3d_status remove_earlier(const struct l3d_train_config *tc, const char *out,
                                 const char *ckroot, const char *found, bool hf) {
    char p[4200];
    for (int i = 0; out && i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", out, outs[i]);
        if (unlink(p) != 0 && errno != ENOENT)
            return l3d_error(L3D_ERR_IO, "--overwrite: cannot remove %s: %s", p, strerror(errno));
    }
    if (hf) { /* the folder's model: its safetensors files, index and config */
        l3d_st_remove(out);
        snprintf(p, sizeof p, "%s/config.json", out);
        unlink(p);
    }
    int n = 0;
    l3d_status st = ckroot[0] ? l3d_ckpt_clear(ckroot, &n) : L3D_OK;
    if (st != L3D_OK) { /* copied first: l3d_error writes the buffer the message is in */
        char why[1024];
        snprintf(why, sizeof why, "%s", l3d_error_message());
        return l3d_error(st, "--overwrite: %s", why);
    }
    if (!tc->quiet)
        printf("overwrite: removed the earlier run's files (%s; %d checkpoint(s))\n", found, n);
    return L3D_OK;
}

/* Rank 0's part. */
static l3d_status claim(const struct l3d_train_config *tc, uint64_t *id) {
    const char *out = tc->out_dir;
    char ckroot[4096] = "", run_path[4200] = "", p[4200];
    if (tc->ckpt_dir)
        snprintf(ckroot, sizeof ckroot, "%s", tc->ckpt_dir);
    else if (out)
        snprintf(ckroot, sizeof ckroot, "%s/checkpoints", out);
    if (out) snprintf(run_path, sizeof run_path, "%s/run", out);
    if (tc->resume && tc->overwrite)
        return l3d_error(L3D_ERR_ARG, "--resume continues the run in %s and --overwrite starts it "
                         "over: give one of them", out ? out : ckroot);

    l3d_status st = no_output_over_input(tc);
    if (st != L3D_OK) return st;

    /* what an earlier run left (names: the message lists them); `run` alone (a run that
     * stopped before its first step: bad data, a layout error) holds nothing to lose */
    char found[128] = "";
    for (int i = 0; out && i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", out, outs[i]);
        if (exists(p)) strcat(strcat(found, found[0] ? ", " : ""), outs[i]);
    }
    /* a Hugging Face model (an earlier run's, or one put there): --out writes its own there */
    const bool hf = out && l3d_hf_has_model(out);
    if (hf) strcat(strcat(found, found[0] ? ", " : ""), "a Hugging Face model's files");
    if (ckroot[0]) {
        snprintf(p, sizeof p, "%s/latest", ckroot);
        if (exists(p))
            strcat(strcat(found, found[0] ? ", " : ""), tc->ckpt_dir ? "--ckpt-dir's latest"
                                                                    : "checkpoints/latest");
    }
    uint64_t old_id = 0;
    struct l3d_model_spec old = {0};
    bool have_run = found[0] && out && read_run(run_path, &old_id, &old);
    if (hf && tc->resume && !have_run)
        return l3d_error(L3D_ERR_ARG, "--resume: %s holds a Hugging Face model but no run of "
                         "llm3d (no readable %s/run): the run would replace that model at its "
                         "end; give another --out (or --overwrite to replace it)", out, out);

    if (found[0] && !tc->resume && !tc->overwrite)
        return l3d_error(L3D_ERR_ARG, "%s holds an earlier run (%s): continue it with --resume "
                         "auto, or start a new run there with --overwrite (it removes the run, "
                         "metrics.jsonl and model.bin files, the Hugging Face folder's "
                         "config.json and safetensors, and the checkpoints' latest and "
                         "step_NNNNNNNN directories, nothing else), or give another --out",
                         out ? out : ckroot, found);
    if (tc->overwrite && found[0] && (st = remove_earlier(tc, out, ckroot, found, hf)) != L3D_OK)
        return st;

    *id = 0;
    if (tc->resume) {
        /* the model the flags describe must be the run's (or the checkpoint's) */
        char diff[512];
        if (have_run) {
            differences(&old, &tc->model, diff, sizeof diff);
            if (diff[0])
                return l3d_error(L3D_ERR_ARG, "--resume: %s holds a run of another model: %s; "
                                 "give the run's sizes, or another --out for a new run", out,
                                 diff);
            *id = old_id;
        }
        char dir[4096] = "";
        bool autom = strcmp(tc->resume, "auto") == 0;
        if (l3d_ckpt_resolve(tc->resume, ckroot[0] ? ckroot : NULL, dir, sizeof dir) == L3D_OK &&
            dir[0]) {
            struct l3d_model_spec cc;
            int64_t step;
            /* auto: the directory's own checkpoint must be this model's (a step directory given
             * by name is checked by the load, which names both models) */
            if (autom && l3d_ckpt_read_config(dir, &cc, &step) == L3D_OK) {
                differences(&cc, &tc->model, diff, sizeof diff);
                if (diff[0])
                    return l3d_error(L3D_ERR_ARG, "--resume: %s holds a checkpoint of another "
                                     "model: %s; give its sizes", dir, diff);
            } /* an unreadable one: the load says why */
            st = *id ? L3D_OK : l3d_ckpt_run_id(dir, id);
            if (st != L3D_OK) { /* copied first: l3d_error writes the buffer the message is in */
                char why[1024];
                snprintf(why, sizeof why, "%s", l3d_error_message());
                return l3d_error(st, "--resume: %s", why);
            }
        }
    }
    if (!*id) *id = new_id();
    if (!out) return L3D_OK;
    st = l3d_mkdir_p(out);
    if (st == L3D_OK) st = write_run(run_path, *id, &tc->model);
    if (st == L3D_OK && tc->config_yaml) { /* the flags, which --config reads back */
        snprintf(p, sizeof p, "%s/run.yaml", out);
        st = l3d_write_file(p, "run.yaml", tc->config_yaml, strlen(tc->config_yaml));
    }
    return st;
}

l3d_status l3d_train_run_claim(const struct l3d_train_config *tc, struct l3d_comm *world,
                               uint64_t *id, bool *report) {
    *id = 0;
    l3d_status st = world->rank == 0 ? claim(tc, id) : L3D_OK;
    if ((st = l3d_comm_agree(world, st, report)) != L3D_OK) return st;
    if (world->size > 1) l3d_comm_broadcast(world, id, 8, L3D_U8, 0, NULL);
    return L3D_OK;
}
