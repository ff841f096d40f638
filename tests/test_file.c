/* The one file writer (include/llm3d/file.h): what it writes, what it refuses to replace, its
 * temporaries (unpredictable, removed on failure, a dead writer's removed by the next write), and
 * folders replaced whole with the entries they do not own carried over. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llm3d/file.h"
#include "test.h"

static char scratch[256];

static const char *at(const char *name) {
    static char p[4][600];
    static int k;
    char *s = p[k++ & 3];
    snprintf(s, 600, "%s/%s", scratch, name);
    return s;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    L3D_ASSERT(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* The file's text ("" when it cannot be read). */
static const char *text_of(const char *path) {
    static char buf[256];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    return buf;
}

/* Entries of dir whose name holds the writer's temporary tag. */
static int temporaries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".l3d-tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static bool refused(l3d_status st, const char *what) {
    bool ok = st != L3D_OK && strstr(l3d_error_message(), what) != NULL;
    if (!ok) fprintf(stderr, "expected an error with '%s', got %s\n", what,
                     st == L3D_OK ? "success" : l3d_error_message());
    return ok;
}

static void test_write(void) {
    CHECK(l3d_write_file(at("a.txt"), "test file", "one", 3) == L3D_OK);
    CHECK(strcmp(text_of(at("a.txt")), "one") == 0);
    struct l3d_out o; /* a stream and raw writes mixed, in order */
    CHECK(l3d_out_open(&o, at("a.txt"), "test file") == L3D_OK);
    fprintf(l3d_out_stream(&o), "t%s", "wo");
    CHECK(l3d_out_write(&o, "+", 1) == L3D_OK);
    fputs("three", l3d_out_stream(&o));
    CHECK(strcmp(text_of(at("a.txt")), "one") == 0); /* nothing in place before the commit */
    CHECK(l3d_out_commit(&o) == L3D_OK);
    CHECK(strcmp(text_of(at("a.txt")), "two+three") == 0);
    CHECK(temporaries(scratch) == 0);
    /* aborted: the old file stays, no temporary */
    CHECK(l3d_out_open(&o, at("a.txt"), "test file") == L3D_OK);
    l3d_out_write(&o, "junk", 4);
    l3d_out_abort(&o);
    CHECK(strcmp(text_of(at("a.txt")), "two+three") == 0 && temporaries(scratch) == 0);
    /* a folder that does not exist: one error naming the file */
    CHECK(refused(l3d_write_file(at("none/b.txt"), "test file", "x", 1),
                  "cannot create the test file"));
}

static void test_refusals(void) {
    /* a FIFO, a link (to a file and dangling), a directory: named, left as they were */
    CHECK(mkfifo(at("fifo"), 0644) == 0);
    CHECK(refused(l3d_write_file(at("fifo"), "plot", "x", 1), "it is a FIFO"));
    struct stat sb;
    CHECK(lstat(at("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    put(at("target"), "keep");
    CHECK(symlink(at("target"), at("link")) == 0);
    CHECK(refused(l3d_write_file(at("link"), "plot", "x", 1), "it is a symbolic link"));
    CHECK(strcmp(text_of(at("target")), "keep") == 0);
    CHECK(lstat(at("link"), &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(symlink(at("nowhere"), at("dangling")) == 0);
    CHECK(refused(l3d_write_file(at("dangling"), "plot", "x", 1), "symbolic link"));
    CHECK(lstat(at("nowhere"), &sb) != 0);
    CHECK(mkdir(at("dir"), 0755) == 0);
    CHECK(refused(l3d_write_file(at("dir"), "plot", "x", 1), "it is a directory"));
    /* a device: refused before any temporary is made (open only: nothing to put back) */
    struct l3d_out o;
    CHECK(refused(l3d_out_open(&o, "/dev/null", "plot"), "it is a character device"));
    CHECK(temporaries(scratch) == 0);
    /* a regular file turned into a link between open and commit: refused at the rename */
    put(at("c.txt"), "old");
    CHECK(l3d_out_open(&o, at("c.txt"), "test file") == L3D_OK);
    l3d_out_write(&o, "new", 3);
    CHECK(unlink(at("c.txt")) == 0 && symlink(at("target"), at("c.txt")) == 0);
    CHECK(refused(l3d_out_commit(&o), "symbolic link"));
    CHECK(strcmp(text_of(at("target")), "keep") == 0 && temporaries(scratch) == 0);
}

static void test_temporaries(void) {
    /* two writers of one path: two temporaries, each complete; the later commit wins */
    struct l3d_out a, b;
    CHECK(l3d_out_open(&a, at("t.txt"), "test file") == L3D_OK);
    CHECK(l3d_out_open(&b, at("t.txt"), "test file") == L3D_OK);
    CHECK(strcmp(a.tmp, b.tmp) != 0 && temporaries(scratch) == 2);
    l3d_out_write(&a, "aaaa", 4);
    l3d_out_write(&b, "bb", 2);
    CHECK(l3d_out_commit(&b) == L3D_OK && l3d_out_commit(&a) == L3D_OK);
    CHECK(strcmp(text_of(at("t.txt")), "aaaa") == 0 && temporaries(scratch) == 0);
    /* a writer killed before its rename: its temporary goes at the next write of the path; a
     * running writer's (this process's parent) and another file's stay */
    pid_t child = fork();
    if (child == 0) {
        struct l3d_out c;
        if (l3d_out_open(&c, at("t.txt"), "test file") == L3D_OK) l3d_out_write(&c, "half", 4);
        _exit(0); /* no commit, no abort: as if killed */
    }
    int status;
    CHECK(waitpid(child, &status, 0) == child && temporaries(scratch) == 1);
    char live[600], other[600];
    snprintf(live, sizeof live, "%s/.t.txt.l3d-tmp.%ld.00000000000000aa", scratch,
             (long)getppid());
    snprintf(other, sizeof other, "%s/.u.txt.l3d-tmp.%ld.00000000000000bb", scratch, (long)child);
    put(live, "x");
    put(other, "x");
    CHECK(l3d_write_file(at("t.txt"), "test file", "c", 1) == L3D_OK);
    CHECK(temporaries(scratch) == 2 && access(live, F_OK) == 0 && access(other, F_OK) == 0);
    unlink(live);
    unlink(other);
}

static bool owned(const char *name) { return strncmp(name, "model", 5) == 0; }

static void test_folder(void) {
    /* a new folder: moved into place */
    struct l3d_dir_out d;
    char p[L3D_FILE_PATH_CAP + 32];
    CHECK(l3d_dir_out_begin(&d, at("f"), "model folder", owned) == L3D_OK);
    snprintf(p, sizeof p, "%s/model-1-of-2", d.tmp);
    put(p, "old 1");
    snprintf(p, sizeof p, "%s/model-2-of-2", d.tmp);
    put(p, "old 2");
    struct stat sb;
    CHECK(lstat(at("f"), &sb) != 0); /* not there before the commit */
    CHECK(l3d_dir_out_commit(&d) == L3D_OK);
    CHECK(strcmp(text_of(at("f/model-2-of-2")), "old 2") == 0 && temporaries(scratch) == 0);
    /* the user's files beside the model: a file, a folder of files, a link */
    put(at("f/tokenizer.json"), "tok");
    CHECK(mkdir(at("f/ckpt"), 0755) == 0 && mkdir(at("f/ckpt/step"), 0755) == 0);
    put(at("f/ckpt/step/rank"), "r");
    CHECK(symlink("tokenizer.json", at("f/alias")) == 0);
    struct stat tok;
    CHECK(stat(at("f/tokenizer.json"), &tok) == 0);
    /* replaced: the old model's files gone (two shards -> one file), the others carried over */
    CHECK(l3d_dir_out_begin(&d, at("f"), "model folder", owned) == L3D_OK);
    snprintf(p, sizeof p, "%s/model", d.tmp);
    put(p, "new");
    CHECK(strcmp(text_of(at("f/model-1-of-2")), "old 1") == 0); /* the old one until the commit */
    CHECK(l3d_dir_out_commit(&d) == L3D_OK);
    CHECK(strcmp(text_of(at("f/model")), "new") == 0);
    CHECK(access(at("f/model-1-of-2"), F_OK) != 0 && access(at("f/model-2-of-2"), F_OK) != 0);
    CHECK(stat(at("f/tokenizer.json"), &sb) == 0 && sb.st_ino == tok.st_ino); /* the same file */
    CHECK(strcmp(text_of(at("f/ckpt/step/rank")), "r") == 0);
    CHECK(lstat(at("f/alias"), &sb) == 0 && S_ISLNK(sb.st_mode) &&
          strcmp(text_of(at("f/alias")), "tok") == 0);
    CHECK(temporaries(scratch) == 0);
    /* aborted: nothing changes */
    CHECK(l3d_dir_out_begin(&d, at("f"), "model folder", owned) == L3D_OK);
    l3d_dir_out_abort(&d);
    CHECK(strcmp(text_of(at("f/model")), "new") == 0 && temporaries(scratch) == 0);
    /* a file where the folder should be: refused by name */
    put(at("plain"), "x");
    CHECK(refused(l3d_dir_out_begin(&d, at("plain"), "model folder", owned), "not a folder"));
    /* negative control: without `owned`, nothing is carried over */
    CHECK(l3d_dir_out_begin(&d, at("f"), "model folder", NULL) == L3D_OK);
    CHECK(l3d_dir_out_commit(&d) == L3D_OK);
    CHECK(access(at("f/tokenizer.json"), F_OK) != 0 && access(at("f/model"), F_OK) != 0);
    /* l3d_remove_tree does not follow links */
    put(at("keepme"), "k");
    CHECK(mkdir(at("g"), 0755) == 0 && symlink(scratch, at("g/up")) == 0);
    CHECK(l3d_remove_tree(at("g")) && access(at("keepme"), F_OK) == 0);
}

int main(void) {
    snprintf(scratch, sizeof scratch, "%s/l3d-test-file-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    L3D_ASSERT(mkdtemp(scratch));
    test_write();
    test_refusals();
    test_temporaries();
    test_folder();
    l3d_remove_tree(scratch);
    return TEST_REPORT();
}
