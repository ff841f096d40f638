/* The command-line parser of train and bench (src/cli/train.c, src/cli/args.c): the input split
 * at NUL bytes into arguments after "train", parsed into a training configuration. */
#include <getopt.h>

#include "cli/cli.h"
#include "fuzz.h"
#include "llm3d/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = fuzz_text(data, size);
    char *argv[66] = {"train"};
    int argc = 1;
    for (size_t i = 0; i <= size && argc < 65;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    /* getopt keeps a position inside the previous argv: start afresh (optind 0 re-initialises) */
    char *none[] = {"train", NULL};
    optind = 0;
    (void)getopt_long(1, none, "", (const struct option[]){{0, 0, 0, 0}}, NULL);
    struct l3d_train_config tc;
    l3d_train_config_defaults(&tc);
    const char *backend = NULL;
    int rc = l3d_cli_train_flags("train", argc, argv, &tc, &backend);
    if (rc < 0 && (tc.model.L < 1 || tc.model.C % tc.model.NH != 0 || tc.layout.seq > tc.model.maxT))
        abort(); /* accepted flags give a valid model and sequence length */
    if (rc < 0) free((char *)tc.config_yaml);
    l3d_free(buf);
    return 0;
}
