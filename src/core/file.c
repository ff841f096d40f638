/* The one writer of files and folders (include/llm3d/file.h): unpredictable temporaries opened
 * O_EXCL | O_NOFOLLOW beside the destination, fsync, rename over a regular file only; folders
 * written beside their destination and exchanged with it in one rename. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/file.h"

#define TMP_TAG ".l3d-tmp."

static long points; /* passed so far */

static void say_points(void) { fprintf(stderr, "file points: %ld\n", points); }

void l3d_file_test_point(void) {
    static long at = -1;
    if (at < 0) {
        const char *v = getenv("L3D_FILE_TEST_KILL");
        at = v && atol(v) > 0 ? atol(v) : 0;
        if (v && strcmp(v, "count") == 0) atexit(say_points);
    }
    if (++points == at) raise(SIGKILL);
}

/* dir and base name of path (trailing slashes dropped); false when they do not fit. */
static bool split(const char *path, char *dir, char *base) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    if (n == 0 || n >= L3D_FILE_PATH_CAP - 64) return false;
    size_t s = n;
    while (s > 0 && path[s - 1] != '/') s--;
    if (s == 0) {
        strcpy(dir, ".");
    } else {
        size_t d = s - 1 ? s - 1 : 1; /* "/x": the root */
        memcpy(dir, path, d);
        dir[d] = '\0';
    }
    memcpy(base, path + s, n - s);
    base[n - s] = '\0';
    return base[0] != '\0' && strcmp(base, ".") != 0 && strcmp(base, "..") != 0;
}

static const char *kind_of(mode_t m) {
    return S_ISREG(m) ? "a regular file" : S_ISDIR(m) ? "a directory" : S_ISLNK(m) ? "a symbolic link" : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
           : S_ISSOCK(m) ? "a socket" : "a special file";
}

l3d_status l3d_out_check(const char *path, const char *what) {
    struct stat sb;
    if (lstat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return L3D_OK; /* absent: open says why */
    return l3d_error(L3D_ERR_IO, "will not write the %s to %s: it is %s, and llm3d replaces only "
                     "regular files; give the path of a file (or remove what is there)", what,
                     path, kind_of(sb.st_mode));
}

/* Removes dir's temporaries of base left by writers no longer running. */
static void remove_stale(const char *dir, const char *base) {
    char prefix[NAME_MAX + 32], p[L3D_FILE_PATH_CAP + NAME_MAX + 2];
    int k = snprintf(prefix, sizeof prefix, ".%s" TMP_TAG, base);
    if (k <= 0 || (size_t)k >= sizeof prefix) return;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, (size_t)k) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + k, &end, 10);
        if (end == e->d_name + k || *end != '.' || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* still running */
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        l3d_remove_tree(p);
    }
    if (d) closedir(d);
}

static void tmp_name(char *tmp, const char *dir, const char *base) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) { /* never on Linux >= 3.17 */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)tmp;
    }
    int k = snprintf(tmp, L3D_FILE_PATH_CAP, "%s/.%s" TMP_TAG "%ld.%016llx", dir, base,
                     (long)getpid(), (unsigned long long)r);
    L3D_ASSERT(k > 0 && k < L3D_FILE_PATH_CAP); /* split() left 64 characters for the tag */
}

static l3d_status sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open %s to sync it: %s", dir, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    /* EINVAL: a file system that cannot sync a directory (the rename is done all the same) */
    return rc == 0 || e == EINVAL ? L3D_OK : l3d_error(L3D_ERR_IO, "cannot sync %s: %s", dir, strerror(e));
}

l3d_status l3d_out_open(struct l3d_out *o, const char *path, const char *what) {
    char dir[L3D_FILE_PATH_CAP], base[L3D_FILE_PATH_CAP];
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->what = what;
    if (!split(path, dir, base) || strlen(base) > NAME_MAX - 48)
        return o->st = l3d_error(L3D_ERR_ARG, "cannot write the %s to '%s': give the path of a "
                                 "file (at most %d characters, a name of at most %d)", what, path,
                                 L3D_FILE_PATH_CAP - 65, NAME_MAX - 48);
    snprintf(o->path, sizeof o->path, "%s", path);
    if ((o->st = l3d_out_check(path, what)) != L3D_OK) return o->st;
    remove_stale(dir, base);
    for (int tries = 0; o->fd < 0 && tries < 8; tries++) {
        tmp_name(o->tmp, dir, base);
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (o->fd < 0 && errno != EEXIST) break;
    }
    if (o->fd < 0) {
        o->tmp[0] = '\0';
        return o->st = l3d_error(L3D_ERR_IO, "cannot create the %s %s (a temporary file in %s): "
                                 "%s", what, path, dir, strerror(errno));
    }
    l3d_file_test_point();
    return L3D_OK;
}

l3d_status l3d_out_write(struct l3d_out *o, const void *data, size_t n) {
    if (o->st != L3D_OK) return o->st;
    if (o->f && fflush(o->f) != 0)
        return o->st = l3d_error(L3D_ERR_IO, "cannot write the %s %s: %s", o->what, o->path,
                                 strerror(errno));
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(o->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return o->st = l3d_error(L3D_ERR_IO, "cannot write the %s %s: %s", o->what, o->path,
                                     k < 0 ? strerror(errno) : "nothing written");
        p += k;
        n -= (size_t)k;
    }
    l3d_file_test_point();
    return L3D_OK;
}

FILE *l3d_out_stream(struct l3d_out *o) {
    if (o->f) return o->f;
    if (o->fd >= 0) o->f = fdopen(o->fd, "wb");
    if (o->f) return o->f;
    if (o->st == L3D_OK)
        o->st = l3d_error(L3D_ERR_IO, "cannot write the %s %s: %s", o->what, o->path,
                          strerror(errno));
    o->sink = true; /* writes go nowhere; commit reports the error */
    return o->f = fopen("/dev/null", "w");
}

static void close_tmp(struct l3d_out *o) {
    if (o->f) {
        if (fclose(o->f) != 0 && o->st == L3D_OK)
            o->st = l3d_error(L3D_ERR_IO, "cannot write the %s %s: %s", o->what, o->path,
                              strerror(errno));
        if (o->sink && o->fd >= 0) close(o->fd);
    } else if (o->fd >= 0) {
        close(o->fd);
    }
    o->f = NULL;
    o->fd = -1;
    o->sink = false;
}

void l3d_out_abort(struct l3d_out *o) {
    close_tmp(o);
    if (o->tmp[0]) unlink(o->tmp);
    o->tmp[0] = '\0';
}

l3d_status l3d_out_commit(struct l3d_out *o) {
    if (o->st == L3D_OK && o->f && (fflush(o->f) != 0 || ferror(o->f)))
        o->st = l3d_error(L3D_ERR_IO, "cannot write the %s %s: %s", o->what, o->path,
                          strerror(errno ? errno : EIO));
    if (o->st == L3D_OK && fsync(o->fd) != 0)
        o->st = l3d_error(L3D_ERR_IO, "cannot sync the %s %s: %s", o->what, o->path,
                          strerror(errno));
    close_tmp(o);
    if (o->st == L3D_OK) l3d_file_test_point();
    if (o->st == L3D_OK) o->st = l3d_out_check(o->path, o->what); /* again: it may have changed */
    if (o->st == L3D_OK && rename(o->tmp, o->path) != 0)
        o->st = l3d_error(L3D_ERR_IO, "cannot put the %s in place (rename %s to %s): %s", o->what,
                          o->tmp, o->path, strerror(errno));
    if (o->st != L3D_OK) {
        l3d_out_abort(o);
        return o->st;
    }
    o->tmp[0] = '\0';
    l3d_file_test_point();
    char dir[L3D_FILE_PATH_CAP], base[L3D_FILE_PATH_CAP];
    split(o->path, dir, base);
    return o->st = sync_dir(dir);
}

l3d_status l3d_write_file(const char *path, const char *what, const void *data, size_t n) {
    struct l3d_out o;
    if (l3d_out_open(&o, path, what) != L3D_OK) return o.st;
    l3d_out_write(&o, data, n);
    return l3d_out_commit(&o);
}

l3d_status l3d_open_log(const char *path, const char *what, bool append, FILE **f) {
    *f = NULL;
    l3d_status st = l3d_out_check(path, what);
    if (st != L3D_OK) return st;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open the %s %s: %s", what, path,
                                 strerror(errno));
    struct stat sb;
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        st = l3d_out_check(path, what); /* names what is there */
        return st != L3D_OK ? st : l3d_error(L3D_ERR_IO, "will not write the %s to %s: not a "
                                             "regular file", what, path);
    }
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || (!append && ftruncate(fd, 0) != 0) ||
        !(*f = fdopen(fd, "a"))) {
        int e = errno;
        close(fd);
        return l3d_error(L3D_ERR_IO, "cannot write the %s %s: %s", what, path, strerror(e));
    }
    return L3D_OK;
}

l3d_status l3d_log_append(FILE *f, const char *path, const void *data, size_t n,
                          const char *unit) {
    long at = ftell(f);
    errno = 0;
    bool ok = fwrite(data, 1, n, f) == n;
    ok = fflush(f) == 0 && ok;
    if (ok) return L3D_OK;
    int e = errno ? errno : EIO;
    clearerr(f);
    if (at >= 0 && ftruncate(fileno(f), (off_t)at) == 0) fseek(f, at, SEEK_SET);
    return l3d_error(L3D_ERR_IO, "cannot write %s: %s (the run stops; it ends with the last "
                     "complete %s)", path, strerror(e), unit);
}

/* ---- trees ----------------------------------------------------------------------------------- */

static int remove_one(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)ftw;
    if (type == FTW_DP) rmdir(p);
    else unlink(p);
    return 0;
}

bool l3d_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return true;
    if (!S_ISDIR(sb.st_mode)) return unlink(path) == 0;
    nftw(path, remove_one, 32, FTW_DEPTH | FTW_PHYS);
    return lstat(path, &sb) != 0;
}

/* Every entry of from that is not in to (at the top: not owned) hard-linked into to: files
 * linked, directories made and filled, symbolic links made again. */
static l3d_status carry(const char *from, const char *to, bool (*owned)(const char *), int depth) {
    if (depth > 32)
        return l3d_error(L3D_ERR_IO, "%s: folders nested more than 32 deep: not carried over",
                         from);
    DIR *d = opendir(from);
    if (!d) return l3d_error(L3D_ERR_IO, "cannot read %s: %s", from, strerror(errno));
    l3d_status st = L3D_OK;
    struct dirent *e;
    char a[L3D_FILE_PATH_CAP], b[L3D_FILE_PATH_CAP], target[L3D_FILE_PATH_CAP];
    while (st == L3D_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        struct stat sb;
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || (owned && owned(n))) continue;
        if (strstr(n, TMP_TAG)) continue; /* another writer's temporary */
        if ((size_t)snprintf(a, sizeof a, "%s/%s", from, n) >= sizeof a ||
            (size_t)snprintf(b, sizeof b, "%s/%s", to, n) >= sizeof b) {
            st = l3d_error(L3D_ERR_IO, "%s/%s: path too long to carry over", from, n);
            break;
        }
        if (lstat(b, &sb) == 0 || lstat(a, &sb) != 0) continue; /* the new folder's own */
        int rc = 0;
        if (S_ISDIR(sb.st_mode)) {
            rc = mkdir(b, sb.st_mode & 07777);
            if (rc == 0) st = carry(a, b, NULL, depth + 1);
        } else if (S_ISLNK(sb.st_mode)) {
            ssize_t k = readlink(a, target, sizeof target - 1);
            rc = k < 0 ? -1 : (target[k] = '\0', symlink(target, b));
        } else if (S_ISREG(sb.st_mode)) {
            rc = link(a, b);
        } /* a FIFO, a socket or a device in a model folder: not carried */
        if (rc != 0 && st == L3D_OK)
            st = l3d_error(L3D_ERR_IO, "cannot carry %s over into the new folder: %s", a,
                           strerror(errno));
        if (st == L3D_OK) l3d_file_test_point();
    }
    closedir(d);
    return st;
}

l3d_status l3d_dir_out_begin(struct l3d_dir_out *o, const char *path, const char *what,
                             bool (*owned)(const char *name)) {
    char dir[L3D_FILE_PATH_CAP], base[L3D_FILE_PATH_CAP], real[PATH_MAX];
    memset(o, 0, sizeof *o);
    o->what = what;
    o->owned = owned;
    struct stat sb, lsb;
    bool there = stat(path, &sb) == 0;
    if (there && !S_ISDIR(sb.st_mode))
        return l3d_error(L3D_ERR_IO, "will not write the %s into %s: it is %s, not a folder; "
                         "give another path", what, path, kind_of(sb.st_mode));
    /* a link to a folder: the folder it names is replaced, the link kept */
    if (there && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode) && realpath(path, real))
        path = real;
    if (!split(path, dir, base) || strlen(base) > NAME_MAX - 48)
        return l3d_error(L3D_ERR_ARG, "cannot write the %s into '%s': give a folder's path (at "
                         "most %d characters, a name of at most %d)", what, path,
                         L3D_FILE_PATH_CAP - 65, NAME_MAX - 48);
    snprintf(o->path, sizeof o->path, "%s", path);
    l3d_status st = l3d_mkdir_p(dir);
    if (st != L3D_OK) return st;
    remove_stale(dir, base);
    int rc = -1;
    for (int tries = 0; rc != 0 && tries < 8; tries++) {
        tmp_name(o->tmp, dir, base);
        rc = mkdir(o->tmp, 0777);
        if (rc != 0 && errno != EEXIST) break;
    }
    if (rc != 0) {
        o->tmp[0] = '\0';
        return l3d_error(L3D_ERR_IO, "cannot create the %s %s (a temporary folder in %s): %s",
                         what, path, dir, strerror(errno));
    }
    if (there) chmod(o->tmp, sb.st_mode & 07777);
    l3d_file_test_point();
    return L3D_OK;
}

void l3d_dir_out_abort(struct l3d_dir_out *o) {
    if (o->tmp[0]) l3d_remove_tree(o->tmp);
    o->tmp[0] = '\0';
}

l3d_status l3d_dir_out_commit(struct l3d_dir_out *o) {
    char dir[L3D_FILE_PATH_CAP], base[L3D_FILE_PATH_CAP];
    split(o->path, dir, base);
    l3d_status st = L3D_OK;
    /* absent: moved into place, unless somebody made it meanwhile */
    if (renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->path, RENAME_NOREPLACE) == 0) {
        o->tmp[0] = '\0';
        l3d_file_test_point();
        return sync_dir(dir);
    }
    struct stat sb;
    int e = errno;
    if (e == EINVAL && lstat(o->path, &sb) != 0 && rename(o->tmp, o->path) == 0) {
        o->tmp[0] = '\0'; /* a file system without RENAME_NOREPLACE */
        return sync_dir(dir);
    }
    if (e != EEXIST && e != ENOTEMPTY && e != EINVAL)
        st = l3d_error(L3D_ERR_IO, "cannot put the %s in place (rename %s to %s): %s", o->what,
                       o->tmp, o->path, strerror(e));
    if (st == L3D_OK && o->owned) st = carry(o->path, o->tmp, o->owned, 0);
    if (st == L3D_OK) st = sync_dir(o->tmp);
    if (st == L3D_OK) {
        l3d_file_test_point();
        if (renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->path, RENAME_EXCHANGE) != 0)
            st = l3d_error(L3D_ERR_IO, "cannot exchange %s with the new %s (%s): %s; the "
                           "folder is unchanged", o->path, o->what, o->tmp, strerror(errno));
    }
    if (st != L3D_OK) {
        l3d_dir_out_abort(o);
        return st;
    }
    l3d_file_test_point();
    st = sync_dir(dir);
    l3d_remove_tree(o->tmp); /* the old folder now */
    o->tmp[0] = '\0';
    return st;
}
