/*
 * One writer for every file llm3d creates (docs/DESIGN.md "Writing files"): checkpoints, model
 * files and folders, plots, traces, profiles, token shards, tokenizer files.
 *
 *   struct l3d_out o;
 *   if (l3d_out_open(&o, path, "plot") != L3D_OK) return error;   // refuses a FIFO, a link, ...
 *   l3d_out_write(&o, bytes, n);               // or fprintf(l3d_out_stream(&o), ...)
 *   l3d_status st = l3d_out_commit(&o);        // fsync, rename over path, fsync the directory
 *
 * A file is written to a temporary in its destination's directory, named
 * ".NAME.l3d-tmp.PID.RANDOM" (64 random bits from getrandom), created with
 * O_CREAT | O_EXCL | O_NOFOLLOW, so a planted file or link of any name is never opened, and two
 * writers of one path never share a temporary. It is fsynced and renamed over the destination
 * only when that is absent or a regular file: a directory, a symbolic link, a FIFO, a device or a
 * socket is refused by name before anything is written (and checked again before the rename).
 * A failed write removes its temporary; a killed writer's temporary (its PID no longer running)
 * is removed by the next write of the same path.
 *
 * A folder (a Hugging Face model) is written whole beside its destination, in
 * ".NAME.l3d-tmp.PID.RANDOM/", then put in place by one rename: where the destination exists,
 * its other entries (anything the writer does not own: a tokenizer, a run's metrics and
 * checkpoints) are hard-linked into the new folder and the two are exchanged atomically
 * (renameat2 RENAME_EXCHANGE), the old one then removed. A reader sees the old folder or the new
 * one, never a mix.
 */
#ifndef LLM3D_FILE_H
#define LLM3D_FILE_H

#include "llm3d/core.h"

#define L3D_FILE_PATH_CAP 4096

struct l3d_out {
    int fd;
    FILE *f; /* l3d_out_stream's, or NULL */
    bool sink; /* f writes to /dev/null: the stream could not be made */
    l3d_status st; /* the first error; later writes do nothing */
    const char *what;
    char path[L3D_FILE_PATH_CAP], tmp[L3D_FILE_PATH_CAP];
};

/* L3D_OK when path may be replaced by a regular file: absent, or a regular file. Otherwise
 * L3D_ERR_IO naming `what`, the path and what is there ("a FIFO", "a symbolic link", ...). */
l3d_status l3d_out_check(const char *path, const char *what);

l3d_status l3d_out_open(struct l3d_out *o, const char *path, const char *what);
l3d_status l3d_out_write(struct l3d_out *o, const void *data, size_t n);
/* A stdio stream on the temporary (made once, closed by commit / abort). */
FILE *l3d_out_stream(struct l3d_out *o);
/* Flushes, fsyncs and renames the temporary over the destination, then fsyncs the directory;
 * on any error (or an earlier one) the temporary is removed and the destination left as it was. */
l3d_status l3d_out_commit(struct l3d_out *o);
void l3d_out_abort(struct l3d_out *o);

/* A log that grows a line at a time (a run's metrics.jsonl), which cannot be renamed into place:
 * opened for appending (emptied first unless append), without following a link and without
 * blocking, and refused unless it is a regular file or absent. */
l3d_status l3d_open_log(const char *path, const char *what, bool append, FILE **f);
/* Appends n bytes to a log opened so (path for messages) with one write, flushed and checked; on
 * a failure the part written is truncated away, so the log ends with its last complete `unit`
 * ("line", "record"), and L3D_ERR_IO names the path and errno. */
l3d_status l3d_log_append(FILE *f, const char *path, const void *data, size_t n,
                          const char *unit);

/* A whole file in one call. */
l3d_status l3d_write_file(const char *path, const char *what, const void *data, size_t n);

/* The folder writer. `owned(name)` says which entries of the destination the new folder replaces
 * (the others are carried over); NULL: every entry is replaced. */
struct l3d_dir_out {
    char path[L3D_FILE_PATH_CAP], tmp[L3D_FILE_PATH_CAP];
    const char *what;
    bool (*owned)(const char *name);
};
/* Creates the temporary folder (o->tmp): write the new entries there. Refuses a destination that
 * exists and is not a directory (a link to one included). */
l3d_status l3d_dir_out_begin(struct l3d_dir_out *o, const char *path, const char *what,
                             bool (*owned)(const char *name));
l3d_status l3d_dir_out_commit(struct l3d_dir_out *o);
void l3d_dir_out_abort(struct l3d_dir_out *o);

/* Removes a directory tree without following links; false when something stayed. */
bool l3d_remove_tree(const char *path);

/* Test hook: L3D_FILE_TEST_KILL=N makes the process SIGKILL itself at the N-th step of these
 * writers (a write, a sync, a rename, a link: tests/cli/atomic.sh stops writers at each one);
 * L3D_FILE_TEST_KILL=count prints "file points: N" to stderr at exit. */
void l3d_file_test_point(void);

#endif
