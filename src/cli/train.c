/* llm3d train: flags -> struct l3d_train_config -> l3d_train_run (include/llm3d/train.h). */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/pipeline.h"
#include "llm3d/runtime.h"
#include "llm3d/train.h"

static void usage(FILE *f, const char *cmd) {
    bool bench = strcmp(cmd, "bench") == 0;
    if (bench)
        fprintf(f,
            "usage: llm3d bench [flags]\n"
            "       llm3d bench --calibrate [--out FILE] [--quick]   (under mpiexec; see its --help)\n"
            "\n"
            "Measures this machine's fp32 FMA peak and sgemm rates, then trains a model on random\n"
            "tokens through the real training loop (one process) and reports the median step,\n"
            "tokens/s and MFU. --calibrate writes the system profile that llm3d plan reads.\n"
            "Flags: train's below (--train, --val and --out are ignored); defaults --model d12\n"
            "--steps 10 --warmup 2.\n"
            "\n");
    else
        fprintf(f, "usage: llm3d train --train PATTERN [flags]\n\n");
    fprintf(f,
        "model (a preset, then explicit sizes override it):\n"
        "  --model NAME        %s (%s)\n"
        "  --layers L --channels C --heads NH --vocab V --context T\n"
        "  --init-from FILE    start from an llm.c GPT-2 checkpoint instead of random weights;\n"
        "                      the model's sizes come from its header (flags given must agree)\n"
        "data:\n"
        "  --train PATTERN     token shards (llm.c format): a file or a quoted glob\n"
        "  --val PATTERN       validation shards\n"
        "  --batch B           sequences per micro-batch (4)\n"
        "  --seq-len T         tokens per sequence (64, or the context when shorter)\n"
        "  --grad-accum N      micro-batches per step (1)\n"
        "  --global-batch G    sequences per step instead: G / (batch x dp) micro-batches\n"
        "  --sequential        read windows in order instead of shuffled\n"
        "optimizer:\n"
        "  --steps N (100) --lr LR (6e-4) --min-lr LR (6e-5) --warmup N (10)\n"
        "  --weight-decay W (0.1, matrices only) --beta1 (0.9) --beta2 (0.95) --eps (1e-8)\n"
        "  --grad-clip G       clip the global gradient norm to G, 0 disables (1.0)\n"
        "parallel layout (launch with mpiexec -n N; see README):\n"
        "  --tp N              tensor-parallel size: heads, MLP and vocabulary split (1)\n"
        "  --sequence-parallel LayerNorm and residual regions split by rows over the TP group\n"
        "  --pp N              pipeline-parallel size: contiguous layer ranges per stage (1)\n"
        "  --pp-schedule S     1f1b (default), gpipe, or interleaved (with --pp-virtual)\n"
        "  --pp-virtual V      model chunks per pipeline rank, interleaved schedule (1)\n"
        "  --pp-layers a,b,..  layers of each (virtual) stage (default: balanced by cost)\n"
        "  --recompute MODE    none (default), selective (attention scores), full (layers)\n"
        "  --precision P       fp32 (default), bf16 or fp16: mixed precision (16-bit weights\n"
        "                      and activations; fp32 gradients, master weights, AdamW moments)\n"
        "  --grad-reduce-dtype T  fp32 (default) or bf16, or fp16 with --precision fp16: the\n"
        "                      type data-parallel gradient sums travel in (half the bytes;\n"
        "                      gradients still accumulate over micro-batches in fp32)\n"
        "  fp16 loss scaling (Megatron-LM's defaults): --initial-loss-scale S (2^32)\n"
        "  --loss-scale-window N (1000 steps without overflow double it) --hysteresis N (2\n"
        "  overflows before each back-off) --loss-scale-backoff F (0.5) --min-loss-scale S (1);\n"
        "  --loss-scale S      a static scale instead of the dynamic one\n"
        "  --trace FILE        every rank's pipeline timeline as Chrome trace-event JSON\n"
        "  --dp N              data-parallel replicas (default: ranks / (tp x pp))\n"
        "  --zero S            0: replicated optimizer; 1: AdamW state sharded over dp;\n"
        "                      2: gradients sharded too (0)\n"
        "  --bucket-mb M       gradient reduction pieces in MiB (4)\n"
        "  --comm MODE         overlap: data-parallel gradient pieces and tensor-parallel\n"
        "                      input-gradient sums non-blocking, behind compute (default);\n"
        "                      blocking: the same calls blocking (faster over shared memory on\n"
        "                      busy cores, see docs/BENCHMARKS.md)\n"
        "  --progress MODE     what moves overlapped pieces while ranks compute: none (MPI\n"
        "                      calls between layers only), poll (between kernels) or thread\n"
        "                      (an MPI progress thread, MPI_THREAD_MULTIPLE; for nodes with a\n"
        "                      core to spare) (poll; thread when the launcher puts the ranks\n"
        "                      on several nodes)\n"
        "run:\n"
        "  --val-every N (50) --val-batches N (8) --seed S (1337) --out DIR (none)\n"
        "  --threads N         OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
        "  --backend NAME      the device: cpu, or check (the CPU kernels on a checked device\n"
        "                      arena, for tests; slower) (default: $L3D_BACKEND, else cpu)\n"
        "  --ignore-memory-check  start even when the layout's planned memory exceeds what is\n"
        "                      free (by default it is refused before allocating, with layouts\n"
        "                      that fit)\n"
        "  --allow-cross-node-tp  run even when a TP group spans nodes (a warning; by default\n"
        "                      an error: TP groups are runs of --tp consecutive ranks and must\n"
        "                      sit inside one node; PP and DP groups may cross nodes)\n"
        "  --peak-gflops P     peak for MFU (default: measured FMA peak of this machine)\n"
        "  --quiet             no per-step lines (the start-up summary and the final line stay)\n"
        "  Step k's loss is measured before update k, on the weights of k-1 updates (as llm.c\n"
        "  prints it); validation at step k runs after update k.\n"
        "checkpoints (sharded, atomic; resume on any layout; see README). Several nodes: the\n"
        "  --out and --ckpt-dir directories must be one shared filesystem (NFS, Lustre...); each\n"
        "  rank writes its own shard files there, rank 0 the manifest and model.bin:\n"
        "  --save-every N      save every N steps and after the last (0: never; default 0)\n"
        "  --ckpt-dir DIR      where step directories go (default OUT/checkpoints)\n"
        "  --keep K            keep the newest K checkpoints (3)\n"
        "  --resume auto|PATH  continue from the latest checkpoint (auto: a fresh start when\n"
        "                      there is none) or from a step or checkpoint directory\n"
        "  --overwrite         start a new run in an --out (or --ckpt-dir) that holds an earlier\n"
        "                      run: removes its run, metrics.jsonl, model.bin, checkpoints'\n"
        "                      latest and step_NNNNNNNN directories (nothing else); without it\n"
        "                      such a directory is refused unless --resume is given\n"
        "  SIGTERM / SIGUSR1   save at the next step boundary and exit 0; a second one exits\n"
        "                      at once\n"
        "faults:\n"
        "  --timeout S         abort the job (exit 75) when a rank waits S seconds on another\n"
        "                      (a stopped, hung or dead rank), naming it; the last checkpoint\n"
        "                      is kept (600; 0: wait for ever)\n"
        "  --max-skipped-steps N  a step whose loss or gradient norm is not finite is skipped\n"
        "                      on every rank; N such steps in a row stop the run (10)\n",
        l3d_gpt_preset_names(), bench ? "d12" : "d6");
}

/* --init-from FILE: the model's sizes from the llm.c header into tc->model. given: the values of
 * --layers --channels --heads --vocab --context (0: not given); each given one, and a --model
 * preset's, must equal the file's. Returns -1 when they agree, else the exit status. */
static int init_from_sizes(const char *cmd, struct l3d_train_config *tc, const char *preset,
                           const int given[5]) {
    struct l3d_gpt_config f;
    if (l3d_ckpt_read_llmc_config(tc->init_from, &f) != L3D_OK) {
        fprintf(stderr, "llm3d %s: --init-from: %s\n", cmd, l3d_error_message());
        return 1;
    }
    static const char *const flag[5] = {"layers", "channels", "heads", "vocab", "context"};
    const int file[5] = {f.L, f.C, f.NH, f.V, f.maxT};
    const int pre[5] = {tc->model.L, tc->model.C, tc->model.NH, tc->model.V, tc->model.maxT};
    for (int i = 0; i < 5; i++) {
        if (given[i] && given[i] != file[i]) {
            fprintf(stderr, "llm3d %s: --%s %d disagrees with --init-from %s, whose model has "
                    "%s %d: drop --%s (the file's sizes are used)\n", cmd, flag[i], given[i],
                    tc->init_from, flag[i], file[i], flag[i]);
            return 2;
        }
        if (preset && !given[i] && pre[i] != file[i]) {
            fprintf(stderr, "llm3d %s: --model %s has %s %d but --init-from %s has %d: drop "
                    "--model (the file's sizes are used)\n", cmd, preset, flag[i], pre[i],
                    tc->init_from, file[i]);
            return 2;
        }
    }
    tc->model = f;
    return -1;
}

/* Parses the flags shared by train and bench into tc. Returns -1 on success, else an exit code. */
/* --FLAG fp32|bf16|fp16 into *t: 1, or 0 after one line naming the choices */
static int float_type(const char *cmd, const char *flag, const char *s, enum l3d_dtype *t,
                      const char *choices) {
    static const struct { const char *name; enum l3d_dtype t; } types[] = {
        {"fp32", L3D_F32}, {"bf16", L3D_BF16}, {"fp16", L3D_F16}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(s, types[i].name) == 0) {
            *t = types[i].t;
            return 1;
        }
    fprintf(stderr, "llm3d %s: --%s '%s': choose %s\n", cmd, flag, s, choices);
    return 0;
}

static int train_flags(const char *cmd, int argc, char **argv, struct l3d_train_config *tc,
                       const char **backend) {
    enum { O_LAYERS = 256, O_CHANNELS, O_HEADS, O_VOCAB, O_CONTEXT, O_MINLR, O_WARMUP, O_WD,
           O_BETA1, O_BETA2, O_EPS, O_CLIP, O_VALEVERY, O_VALBATCHES, O_SEQ, O_INIT, O_PEAK,
           O_THREADS, O_QUIET, O_ACCUM, O_TP, O_PP, O_DP, O_ZERO, O_BUCKET, O_DPCOMM, O_SP,
           O_PPSCHED, O_PPVIRT, O_PPLAYERS, O_RECOMPUTE, O_TRACE, O_GLOBAL, O_SAVE_EVERY,
           O_CKPT_DIR, O_KEEP, O_RESUME, O_BACKEND, O_OVERWRITE, O_IGNORE_MEM,
           O_CROSS_TP,
           O_TIMEOUT, O_MAX_SKIPPED, O_PRECISION, O_LS, O_LS_INIT, O_LS_MIN, O_LS_WINDOW,
           O_LS_HYST, O_LS_BACKOFF, O_PROGRESS, O_GRAD_REDUCE };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"layers", required_argument, NULL, O_LAYERS},
        {"channels", required_argument, NULL, O_CHANNELS}, {"heads", required_argument, NULL, O_HEADS},
        {"vocab", required_argument, NULL, O_VOCAB}, {"context", required_argument, NULL, O_CONTEXT},
        {"train", required_argument, NULL, 't'}, {"val", required_argument, NULL, 'v'},
        {"batch", required_argument, NULL, 'b'}, {"seq-len", required_argument, NULL, 'T'},
        {"grad-accum", required_argument, NULL, O_ACCUM}, {"steps", required_argument, NULL, 'n'},
        {"lr", required_argument, NULL, 'l'}, {"min-lr", required_argument, NULL, O_MINLR},
        {"warmup", required_argument, NULL, O_WARMUP}, {"weight-decay", required_argument, NULL, O_WD},
        {"beta1", required_argument, NULL, O_BETA1}, {"beta2", required_argument, NULL, O_BETA2},
        {"eps", required_argument, NULL, O_EPS}, {"grad-clip", required_argument, NULL, O_CLIP},
        {"val-every", required_argument, NULL, O_VALEVERY},
        {"val-batches", required_argument, NULL, O_VALBATCHES},
        {"sequential", no_argument, NULL, O_SEQ}, {"seed", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'}, {"init-from", required_argument, NULL, O_INIT},
        {"peak-gflops", required_argument, NULL, O_PEAK}, {"threads", required_argument, NULL, O_THREADS},
        {"quiet", no_argument, NULL, O_QUIET}, {"help", no_argument, NULL, 'h'},
        {"tp", required_argument, NULL, O_TP}, {"pp", required_argument, NULL, O_PP},
        {"dp", required_argument, NULL, O_DP}, {"zero", required_argument, NULL, O_ZERO},
        {"bucket-mb", required_argument, NULL, O_BUCKET},
        {"comm", required_argument, NULL, O_DPCOMM},
        {"progress", required_argument, NULL, O_PROGRESS},
        {"sequence-parallel", no_argument, NULL, O_SP},
        {"pp-schedule", required_argument, NULL, O_PPSCHED},
        {"pp-virtual", required_argument, NULL, O_PPVIRT},
        {"pp-layers", required_argument, NULL, O_PPLAYERS},
        {"recompute", required_argument, NULL, O_RECOMPUTE},
        {"trace", required_argument, NULL, O_TRACE},
        {"global-batch", required_argument, NULL, O_GLOBAL},
        {"save-every", required_argument, NULL, O_SAVE_EVERY},
        {"ckpt-dir", required_argument, NULL, O_CKPT_DIR},
        {"keep", required_argument, NULL, O_KEEP}, {"resume", required_argument, NULL, O_RESUME},
        {"backend", required_argument, NULL, O_BACKEND},
        {"overwrite", no_argument, NULL, O_OVERWRITE},
        {"ignore-memory-check", no_argument, NULL, O_IGNORE_MEM},
        {"allow-cross-node-tp", no_argument, NULL, O_CROSS_TP},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"max-skipped-steps", required_argument, NULL, O_MAX_SKIPPED},
        {"precision", required_argument, NULL, O_PRECISION},
        {"grad-reduce-dtype", required_argument, NULL, O_GRAD_REDUCE},
        {"loss-scale", required_argument, NULL, O_LS},
        {"initial-loss-scale", required_argument, NULL, O_LS_INIT},
        {"min-loss-scale", required_argument, NULL, O_LS_MIN},
        {"loss-scale-window", required_argument, NULL, O_LS_WINDOW},
        {"hysteresis", required_argument, NULL, O_LS_HYST},
        {"loss-scale-backoff", required_argument, NULL, O_LS_BACKOFF},
        {NULL, 0, NULL, 0},
    };
    /* sizes given explicitly override the preset, whatever the order of the flags */
    int L = 0, C = 0, NH = 0, V = 0, maxT = 0, threads = 0;
    float peak = 0.0f;
    const long BIG = 1L << 30;
    int ok = 1, c;
    bool sched_given = false, accum_given = false, seq_given = false;
    const char *ls_flag = NULL; /* a loss-scaling flag given (fp16 only) */
    const char *preset = NULL;
    optind = 1;
    while (ok && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            preset = optarg;
            if (l3d_gpt_config_preset(&tc->model, optarg) != L3D_OK) {
                fprintf(stderr, "llm3d %s: --model: %s\n", cmd, l3d_error_message());
                return 2;
            }
            break;
        case O_LAYERS: ok = l3d_arg_int(cmd, "layers", optarg, 1, 4096, &L); break;
        case O_CHANNELS: ok = l3d_arg_int(cmd, "channels", optarg, 1, 1 << 20, &C); break;
        case O_HEADS: ok = l3d_arg_int(cmd, "heads", optarg, 1, 4096, &NH); break;
        case O_VOCAB: ok = l3d_arg_int(cmd, "vocab", optarg, 2, 65536, &V); break;
        case O_CONTEXT: ok = l3d_arg_int(cmd, "context", optarg, 1, 1 << 20, &maxT); break;
        case 't': tc->train_pattern = optarg; break;
        case 'v': tc->val_pattern = optarg; break;
        case 'b': ok = l3d_arg_int(cmd, "batch", optarg, 1, BIG, &tc->layout.micro_batch); break;
        case 'T':
            ok = l3d_arg_int(cmd, "seq-len", optarg, 1, 1 << 20, &tc->layout.seq);
            seq_given = true;
            break;
        case O_ACCUM:
            ok = l3d_arg_int(cmd, "grad-accum", optarg, 1, BIG, &tc->layout.accum);
            accum_given = true;
            break;
        case 'n': ok = l3d_arg_int(cmd, "steps", optarg, 1, BIG, &tc->steps); break;
        case 'l': ok = l3d_arg_float(cmd, "lr", optarg, 1e-12, 10, &tc->lr); break;
        case O_MINLR: ok = l3d_arg_float(cmd, "min-lr", optarg, 0, 10, &tc->min_lr); break;
        case O_WARMUP: ok = l3d_arg_int(cmd, "warmup", optarg, 0, BIG, &tc->warmup_steps); break;
        case O_WD: ok = l3d_arg_float(cmd, "weight-decay", optarg, 0, 10, &tc->adamw.weight_decay); break;
        case O_BETA1: ok = l3d_arg_float(cmd, "beta1", optarg, 0, 0.999999, &tc->adamw.beta1); break;
        case O_BETA2: ok = l3d_arg_float(cmd, "beta2", optarg, 0, 0.999999999, &tc->adamw.beta2); break;
        case O_EPS: ok = l3d_arg_float(cmd, "eps", optarg, 1e-30, 1, &tc->adamw.eps); break;
        case O_CLIP: ok = l3d_arg_float(cmd, "grad-clip", optarg, 0, 1e30, &tc->adamw.grad_clip); break;
        case O_VALEVERY: ok = l3d_arg_int(cmd, "val-every", optarg, 0, BIG, &tc->val_every); break;
        case O_VALBATCHES: ok = l3d_arg_int(cmd, "val-batches", optarg, 1, BIG, &tc->val_batches); break;
        case O_SEQ: tc->random_batches = false; break;
        case 's': ok = l3d_arg_u64(cmd, "seed", optarg, &tc->seed); break;
        case 'o': tc->out_dir = optarg; break;
        case O_INIT: tc->init_from = optarg; break;
        case O_PEAK: ok = l3d_arg_float(cmd, "peak-gflops", optarg, 1e-3, 1e12, &peak); break;
        case O_THREADS: ok = l3d_arg_int(cmd, "threads", optarg, 1, 1024, &threads); break;
        case O_QUIET: tc->quiet = true; break;
        case O_TP: ok = l3d_arg_int(cmd, "tp", optarg, 1, 1 << 20, &tc->layout.tp); break;
        case O_PP: ok = l3d_arg_int(cmd, "pp", optarg, 1, 1 << 20, &tc->layout.pp); break;
        case O_DP: ok = l3d_arg_int(cmd, "dp", optarg, 1, 1 << 20, &tc->layout.dp); break;
        case O_ZERO: ok = l3d_arg_int(cmd, "zero", optarg, 0, 2, &tc->layout.zero); break;
        case O_SP: tc->layout.sp = true; break;
        case O_PPSCHED:
            if (l3d_pp_kind_parse(optarg, &tc->layout.schedule) != L3D_OK) {
                fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
                ok = 0;
            }
            sched_given = true;
            break;
        case O_PPVIRT: ok = l3d_arg_int(cmd, "pp-virtual", optarg, 1, 256, &tc->layout.v); break;
        case O_PPLAYERS: tc->layout.pp_layers = optarg; break;
        case O_TRACE: tc->trace_path = optarg; break;
        case O_GLOBAL: {
            int g = 0;
            ok = l3d_arg_int(cmd, "global-batch", optarg, 1, BIG, &g);
            tc->layout.global_batch = g;
            break;
        }
        case O_RECOMPUTE:
            if (strcmp(optarg, "none") == 0) {
                tc->layout.recompute = L3D_RECOMPUTE_NONE;
            } else if (strcmp(optarg, "selective") == 0) {
                tc->layout.recompute = L3D_RECOMPUTE_SELECTIVE;
            } else if (strcmp(optarg, "full") == 0) {
                tc->layout.recompute = L3D_RECOMPUTE_FULL;
            } else {
                fprintf(stderr, "llm3d %s: --recompute '%s': choose none, selective or full\n",
                        cmd, optarg);
                ok = 0;
            }
            break;
        case O_GRAD_REDUCE:
            ok = float_type(cmd, "grad-reduce-dtype", optarg, &tc->precision.reduce,
                            "fp32 (the default), bf16, or fp16 (with --precision fp16)");
            break;
        case O_PRECISION:
            ok = float_type(cmd, "precision", optarg, &tc->precision.param,
                            "fp32 (the default), bf16 or fp16 (mixed precision: 16-bit weights "
                            "and activations, fp32 gradients, master weights and optimizer)");
            break;
        case O_LS:
            ls_flag = "loss-scale";
            ok = l3d_arg_double(cmd, ls_flag, optarg, 0, 1e30, &tc->precision.ls.fixed);
            break;
        case O_LS_INIT:
            ls_flag = "initial-loss-scale";
            ok = l3d_arg_double(cmd, ls_flag, optarg, 1e-30, 1e30, &tc->precision.ls.init);
            break;
        case O_LS_MIN:
            ls_flag = "min-loss-scale";
            ok = l3d_arg_double(cmd, ls_flag, optarg, 1e-30, 1e30, &tc->precision.ls.min);
            break;
        case O_LS_WINDOW:
            ls_flag = "loss-scale-window";
            ok = l3d_arg_int(cmd, ls_flag, optarg, 1, BIG, &tc->precision.ls.window);
            break;
        case O_LS_HYST:
            ls_flag = "hysteresis";
            ok = l3d_arg_int(cmd, ls_flag, optarg, 1, BIG, &tc->precision.ls.hysteresis);
            break;
        case O_LS_BACKOFF:
            ls_flag = "loss-scale-backoff";
            ok = l3d_arg_double(cmd, ls_flag, optarg, 1e-6, 0.999999, &tc->precision.ls.backoff);
            break;
        case O_SAVE_EVERY: ok = l3d_arg_int(cmd, "save-every", optarg, 0, BIG, &tc->save_every); break;
        case O_KEEP: ok = l3d_arg_int(cmd, "keep", optarg, 1, 1 << 20, &tc->keep); break;
        case O_CKPT_DIR: tc->ckpt_dir = optarg; break;
        case O_RESUME: tc->resume = optarg; break;
        case O_BACKEND: *backend = optarg; break;
        case O_OVERWRITE: tc->overwrite = true; break;
        case O_IGNORE_MEM: tc->ignore_memory_check = true; break;
        case O_CROSS_TP: tc->allow_cross_node_tp = true; break;
        case O_TIMEOUT: {
            float sec = 0;
            ok = l3d_arg_float(cmd, "timeout", optarg, 0, 1e7, &sec);
            tc->timeout_s = sec;
            break;
        }
        case O_MAX_SKIPPED:
            ok = l3d_arg_int(cmd, "max-skipped-steps", optarg, 1, 1 << 20, &tc->max_skipped);
            break;
        case O_DPCOMM:
            if (strcmp(optarg, "overlap") == 0 || strcmp(optarg, "blocking") == 0) {
                tc->dp_blocking = strcmp(optarg, "blocking") == 0;
            } else {
                fprintf(stderr, "llm3d %s: --comm '%s': choose overlap or blocking\n", cmd, optarg);
                ok = 0;
            }
            break;
        case O_PROGRESS:
            if (strcmp(optarg, "none") == 0)
                tc->progress = L3D_PROGRESS_NONE;
            else if (strcmp(optarg, "poll") == 0)
                tc->progress = L3D_PROGRESS_POLL;
            else if (strcmp(optarg, "thread") == 0)
                tc->progress = L3D_PROGRESS_THREAD;
            else {
                fprintf(stderr, "llm3d %s: --progress '%s': choose none, poll or thread\n", cmd,
                        optarg);
                ok = 0;
            }
            break;
        case O_BUCKET: {
            float mb = 0;
            ok = l3d_arg_float(cmd, "bucket-mb", optarg, 0.004, 4096, &mb);
            tc->layout.bucket_bytes = (size_t)(mb * 1048576.0f);
            break;
        }
        case 'h': usage(stdout, cmd); return 0;
        default:
            fprintf(stderr, "llm3d %s: see llm3d %s --help\n", cmd, cmd);
            return 2;
        }
    }
    if (!ok) return 2;
    if (tc->layout.v > 1 && !sched_given) {
        tc->layout.schedule = L3D_PP_INTERLEAVED;
        tc->layout.schedule_implied = true;
    }
    if (ls_flag && tc->precision.param != L3D_F16) {
        fprintf(stderr, "llm3d %s: --%s: loss scaling is for --precision fp16 (bf16 and fp32 "
                "have fp32's exponent range and need none): drop it or train in fp16\n", cmd,
                ls_flag);
        return 2;
    }
    if (tc->precision.reduce == L3D_F16 && tc->precision.param != L3D_F16) {
        fprintf(stderr, "llm3d %s: --grad-reduce-dtype fp16: fp16 sums need fp16's loss scaling "
                "to keep small gradients from underflowing, so only with --precision fp16; "
                "reduce in bf16 (fp32's exponent range) or fp32 instead\n", cmd);
        return 2;
    }
    if (accum_given && tc->layout.global_batch > 0) {
        fprintf(stderr, "llm3d %s: give --grad-accum or --global-batch, not both (the micro-batches "
                "per step are global batch / (batch x dp))\n", cmd);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "llm3d %s: unexpected argument '%s' (flags only; see --help)\n", cmd,
                argv[optind]);
        return 2;
    }
    if (tc->init_from) { /* the file's sizes; the flags given must agree with them */
        int rc = init_from_sizes(cmd, tc, preset, (const int[]){L, C, NH, V, maxT});
        if (rc >= 0) return rc;
        L = C = NH = V = maxT = 0;
    }
    if (L) tc->model.L = L;
    if (C) tc->model.C = C;
    if (NH) tc->model.NH = NH;
    if (V) tc->model.V = V;
    if (maxT) tc->model.maxT = maxT;
    if (l3d_gpt_config_finish(&tc->model) != L3D_OK) {
        fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
        return 2;
    }
    if ((tc->save_every > 0 || (tc->resume && strcmp(tc->resume, "auto") == 0)) && !tc->out_dir &&
        !tc->ckpt_dir) {
        fprintf(stderr, "llm3d %s: --save-every and --resume auto need a checkpoint directory: give "
                "--out DIR (checkpoints go to DIR/checkpoints) or --ckpt-dir DIR\n", cmd);
        return 2;
    }
    if (!seq_given && tc->layout.seq > tc->model.maxT) tc->layout.seq = tc->model.maxT; /* the default fits */
    if (tc->layout.seq > tc->model.maxT) {
        fprintf(stderr, "llm3d %s: --seq-len %d exceeds the model's context %d: raise --context or "
                "lower --seq-len\n", cmd, tc->layout.seq, tc->model.maxT);
        return 2;
    }
    tc->peak_flops = peak * 1e9;
    if (threads) omp_set_num_threads(threads);
    return -1;
}

/* Every rank parses the flags (before MPI starts) and finds the same errors: rank 0 says them. */
int l3d_cli_train_flags(const char *cmd, int argc, char **argv, struct l3d_train_config *tc,
                        const char **backend) {
    struct l3d_cli_mute mute;
    l3d_cli_mute_begin(&mute);
    /* --progress's default depends on the launch: unset until the flags are read */
    tc->progress = (enum l3d_progress)-1;
    int rc = train_flags(cmd, argc, argv, tc, backend);
    l3d_cli_mute_end(&mute);
    /* Across nodes the progress thread is the default: over TCP a non-blocking message moves only
     * inside MPI calls of both ranks, so a pipeline's 1.5 MiB activation waited for the sender's
     * next call (pp2 across two namespace hosts, d6: 2122 ms a step polled, 1414 ms with the
     * thread; DP pieces: docs/BENCHMARKS.md). Within one node, polling (docs/DESIGN.md). */
    if ((int)tc->progress == -1)
        tc->progress = l3d_cli_launcher_spans_nodes() ? L3D_PROGRESS_THREAD : L3D_PROGRESS_POLL;
    return rc;
}

int l3d_cli_train(int argc, char **argv) {
    struct l3d_train_config tc;
    l3d_train_config_defaults(&tc);
    struct l3d_runtime_opts ro = {.cmd = "train", .stop_signals = true};
    int rc = l3d_cli_train_flags("train", argc, argv, &tc, &ro.backend);
    if (rc >= 0) return rc;
    if (!tc.train_pattern) {
        if (l3d_cli_launcher_rank() == 0)
            fprintf(stderr, "llm3d train: no training data: give --train with a token shard file "
                    "or a quoted glob (make some with llm3d prepare)\n");
        return 2;
    }
    struct l3d_runtime *rt;
    ro.progress_thread = !tc.dp_blocking && tc.progress == L3D_PROGRESS_THREAD;
    if (l3d_runtime_init(&argc, &argv, &ro, &rt) != L3D_OK) return 1;
    struct l3d_train_result res;
    l3d_status st = l3d_train_run(&tc, rt, &res);
    if (st != L3D_OK && res.report_error)
        fprintf(stderr, "llm3d train: %s\n", l3d_error_message());
    l3d_runtime_free(rt);
    return st == L3D_OK ? 0 : 1;
}
