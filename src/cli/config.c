/* --config FILE: a command's flags from a YAML file (read with libyaml), and the file a training
 * run writes of the flags it was given (OUT/run.yaml), which --config reads back (src/cli/cli.h).
 *
 *   model:                     # a section: a --help heading's first word
 *     model: d12
 *     init-from: gpt2.bin      # an untitled group's flags: the heading --help lists them under
 *   optimizer:
 *     lr: 3e-4
 *   quiet: true                # any flag at the top level too; a switch takes true or false
 *
 * Every value is the flag's text, given to the flag's own handler as the command line's would be
 * (a YAML type never changes it: `lr: 1e-3` is the string "1e-3"), before the command line's
 * flags, so that those override the file's whatever their order. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

#include "cli/cli.h"

/* ---- sections and names ------------------------------------------------------------------ */

#define SECTION_CAP 32

const char *l3d_config_section(const struct l3d_flag_group *g, int i, char *buf, size_t cap) {
    while (i >= 0 && !g[i].title) i--; /* --help lists an untitled group under the one before */
    if (i < 0) return NULL;
    size_t k = 0;
    for (const char *t = g[i].title; k + 1 < cap && ((*t >= 'a' && *t <= 'z') || *t == '-'); t++)
        buf[k++] = *t;
    buf[k] = '\0';
    return k ? buf : NULL;
}

/* Levenshtein distance of a and b (names: under 64 characters). */
static int distance(const char *a, const char *b) {
    int n = (int)strlen(b), row[65], prev;
    if (n > 64 || strlen(a) > 64) return 1 << 20;
    for (int j = 0; j <= n; j++) row[j] = j;
    for (int i = 1; a[i - 1]; i++) {
        prev = row[0];
        row[0] = i;
        for (int j = 1; j <= n; j++) {
            int sub = prev + (a[i - 1] != b[j - 1]), cur = row[j];
            int best = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            prev = cur;
        }
    }
    return row[n];
}

/* How far a misspelt key is from name: its edit distance, or that of its words' initials
 * ("learning-rate" is 0 from "lr"). */
static int nearness(const char *key, const char *name) {
    char init[65];
    int k = 0;
    for (const char *p = key; *p && k < 64; p++)
        if (p == key || p[-1] == '-' || p[-1] == '_') init[k++] = *p;
    init[k] = '\0';
    int d = distance(key, name), di = k > 1 ? distance(init, name) : d;
    return d < di ? d : di;
}

/* The listed flag of the groups nearest to key, or NULL when none is near (at most a third of
 * its letters, or 2, changed). *group: its group. */
static const struct l3d_flag *nearest_flag(const char *key, const struct l3d_flag_group *g, int ng,
                                           int *group) {
    const struct l3d_flag *best = NULL;
    int bd = 1 << 20;
    for (int i = 0; i < ng; i++)
        for (const struct l3d_flag *x = g[i].flags; x->name; x++) {
            int d = x->help ? nearness(key, x->name) : bd;
            if (d < bd) best = x, bd = d, *group = i;
        }
    int len = best ? (int)strlen(best->name) : 0;
    return best && bd <= (len / 3 > 2 ? len / 3 : 2) ? best : NULL;
}

/* The flag named name: its group, and its position over the groups' tables (getopt's order). */
static const struct l3d_flag *find_flag(const char *name, const struct l3d_flag_group *g, int ng,
                                        int *group, int *pos) {
    *pos = 0;
    for (int i = 0; i < ng; i++)
        for (const struct l3d_flag *x = g[i].flags; x->name; x++, (*pos)++)
            if (strcmp(x->name, name) == 0) {
                *group = i;
                return x;
            }
    return NULL;
}

/* ---- reading ----------------------------------------------------------------------------- */

static void section_list(const struct l3d_flag_group *g, int ng, char *out, size_t cap);

/* A file being applied: what its messages name and the lines each flag was set on. */
struct reader {
    const char *cmd, *path;
    const struct l3d_flag_group *g;
    int ng;
    yaml_document_t *doc;
    struct l3d_flags_given *given;
    int line_of[L3D_FLAGS_MAX]; /* 0: not in the file */
};

static yaml_node_t *node(struct reader *r, int i) { return yaml_document_get_node(r->doc, i); }
static int line(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }
static const char *text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

/* YAML's null: an empty or ~ or null plain scalar (`lr:` with nothing after it). */
static bool is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = text(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static const char *kind(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a mapping" : n->type == YAML_SEQUENCE_NODE ? "a list"
                                                                                       : "a value";
}

static int unknown_key(struct reader *r, const char *key, int at, const char *section) {
    int gi = 0;
    char sec[SECTION_CAP];
    const struct l3d_flag *near = nearest_flag(key, r->g, r->ng, &gi);
    const char *ns = near ? l3d_config_section(r->g, gi, sec, sizeof sec) : NULL;
    bool elsewhere = near && ns && (!section || strcmp(ns, section) != 0);
    if (near)
        fprintf(stderr, "llm3d %s: unknown key '%s' in %s line %d: did you mean '%s'%s%s%s?\n",
                r->cmd, key, r->path, at, near->name, elsewhere ? " (in section '" : "",
                elsewhere ? ns : "", elsewhere ? ":')" : "");
    else
        fprintf(stderr, "llm3d %s: unknown key '%s' in %s line %d: the keys are the flags of llm3d "
                "%s --help, without their --\n", r->cmd, key, r->path, at, r->cmd);
    return 2;
}

static int unknown_section(struct reader *r, const yaml_node_t *k) {
    char sec[SECTION_CAP], best[SECTION_CAP] = "";
    int bd = 1 << 20;
    for (int i = 0; i < r->ng; i++) {
        const char *s = l3d_config_section(r->g, i, sec, sizeof sec);
        int d = s ? nearness(text(k), s) : bd;
        if (d < bd) bd = d, snprintf(best, sizeof best, "%s", s);
    }
    char list[256];
    section_list(r->g, r->ng, list, sizeof list);
    if (best[0] && bd <= 2)
        fprintf(stderr, "llm3d %s: unknown section '%s:' in %s line %d: did you mean '%s:'?\n",
                r->cmd, text(k), r->path, line(k), best);
    else
        fprintf(stderr, "llm3d %s: unknown section '%s:' in %s line %d: the sections are %s\n",
                r->cmd, text(k), r->path, line(k), list[0] ? list : "none (flags at the top level)");
    return 2;
}

/* The flag's value as its handler takes it: the scalar's text, NULL for a switch set to true;
 * *skip for a switch set to false (as if not given). 2 after one line when it is not one. */
static int value_of(struct reader *r, const struct l3d_flag *x, const yaml_node_t *v,
                    const char **val, bool *skip) {
    *skip = false;
    if (v->type != YAML_SCALAR_NODE || is_null(v)) {
        fprintf(stderr, "llm3d %s: %s line %d: %s takes %s, not %s: write `%s: %s`\n", r->cmd,
                r->path, line(v), x->name, x->arg ? "one value" : "true or false",
                is_null(v) ? "nothing" : kind(v), x->name, x->arg ? x->arg : "true");
        return 2;
    }
    if (strlen(text(v)) != v->data.scalar.length) {
        fprintf(stderr, "llm3d %s: %s line %d: the value of %s holds a NUL character\n", r->cmd,
                r->path, line(v), x->name);
        return 2;
    }
    *val = x->arg ? text(v) : NULL;
    if (x->arg || !strcmp(text(v), "true")) return -1;
    if (!strcmp(text(v), "false")) return *skip = true, -1;
    fprintf(stderr, "llm3d %s: %s line %d: --%s is a switch: give %s: true or %s: false, not "
            "'%s'\n", r->cmd, r->path, line(v), x->name, x->name, x->name, text(v));
    return 2;
}

/* One `key: value` of the file, in section (NULL: at the top level). -1, or 2 after one line. */
static int apply_pair(struct reader *r, const char *section, const yaml_node_t *k,
                      const yaml_node_t *v) {
    int gi = 0, pos = 0, rc;
    char sec[SECTION_CAP];
    const struct l3d_flag *x = find_flag(text(k), r->g, r->ng, &gi, &pos);
    if (!x) return unknown_key(r, text(k), line(k), section);
    const char *own = l3d_config_section(r->g, gi, sec, sizeof sec);
    if (section && (!own || strcmp(own, section) != 0)) {
        fprintf(stderr, "llm3d %s: %s line %d: '%s' belongs %s%s%s, not in section '%s:'\n",
                r->cmd, r->path, line(k), x->name, own ? "in section '" : "at the top level",
                own ? own : "", own ? ":'" : "", section);
        return 2;
    }
    if (r->line_of[pos]) {
        fprintf(stderr, "llm3d %s: %s: '%s' is given twice, on lines %d and %d: keep one\n",
                r->cmd, r->path, x->name, r->line_of[pos], line(k));
        return 2;
    }
    r->line_of[pos] = line(k);
    const char *val = NULL;
    bool skip;
    if ((rc = value_of(r, x, v, &val, &skip)) >= 0) return rc;
    if (skip) return -1;
    /* the handler's message, "llm3d CMD: --FLAG VAL: why", then names the file and line */
    char where[512];
    snprintf(where, sizeof where, "%s: %s line %d", r->cmd, r->path, line(v));
    if (!r->g[gi].set(r->g[gi].ctx, where, x->id, val)) return 2;
    r->given->val[pos] = val;
    r->given->when[pos] = ++r->given->n;
    return -1;
}

/* Whether a top-level `name:` opens a section: a group's. */
static bool is_section(struct reader *r, const char *name) {
    char sec[SECTION_CAP];
    for (int i = 0; i < r->ng; i++) {
        const char *s = l3d_config_section(r->g, i, sec, sizeof sec);
        if (s && strcmp(s, name) == 0) return true;
    }
    return false;
}

static int not_a_name(struct reader *r, const yaml_node_t *k) {
    fprintf(stderr, "llm3d %s: %s line %d: a key is %s: write `flag: value` lines\n", r->cmd,
            r->path, line(k), kind(k));
    return 2;
}

/* A section's pairs (a null value: an empty section, as run.yaml writes one with every flag
 * commented out). */
static int apply_section(struct reader *r, const yaml_node_t *k, const yaml_node_t *v) {
    if (is_null(v)) return -1;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *kk = node(r, p->key), *vv = node(r, p->value);
        int rc = kk->type != YAML_SCALAR_NODE ? not_a_name(r, kk) : apply_pair(r, text(k), kk, vv);
        if (rc >= 0) return rc;
    }
    return -1;
}

static int apply_root(struct reader *r, const yaml_node_t *root) {
    if (root->type != YAML_MAPPING_NODE) {
        fprintf(stderr, "llm3d %s: %s line %d: the file is %s, not a mapping of flags: write "
                "`flag: value` lines, or sections of them (README, Config files)\n", r->cmd,
                r->path, line(root), kind(root));
        return 2;
    }
    int seen[64] = {0}, ns = 0; /* the sections' pairs, for a section given twice */
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(r, p->key), *v = node(r, p->value);
        int rc, gi, pos;
        if (k->type != YAML_SCALAR_NODE) return not_a_name(r, k);
        bool section = is_section(r, text(k)) && (v->type == YAML_MAPPING_NODE || is_null(v));
        if (!section && v->type == YAML_MAPPING_NODE && !find_flag(text(k), r->g, r->ng, &gi, &pos)) {
            rc = unknown_section(r, k);
        } else if (!section) {
            rc = apply_pair(r, NULL, k, v);
        } else {
            for (int i = 0; i < ns; i++)
                if (!strcmp(text(node(r, root->data.mapping.pairs.start[seen[i]].key)), text(k))) {
                    fprintf(stderr, "llm3d %s: %s: section '%s:' is given twice, on lines %d and "
                            "%d: merge them\n", r->cmd, r->path, text(k),
                            line(node(r, root->data.mapping.pairs.start[seen[i]].key)), line(k));
                    return 2;
                }
            if (ns < 64) seen[ns++] = (int)(p - root->data.mapping.pairs.start);
            rc = apply_section(r, k, v);
        }
        if (rc >= 0) return rc;
    }
    return -1;
}

/* The documents read: kept for the life of the process, since the flags' handlers keep pointers
 * into their values (as they do into argv). The one state of this file. */
struct loaded {
    struct loaded *next;
    yaml_document_t doc;
};
static struct loaded *documents;

/* The file's one document into *doc (root NULL: an empty file); 2 after one line. */
static int load(const char *cmd, const char *path, yaml_document_t *doc) {
    struct stat sb;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    FILE *f = dir ? NULL : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llm3d %s: --config %s: cannot read it: %s\n", cmd, path,
                dir ? "a directory" : strerror(errno));
        return 2;
    }
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    yaml_document_t more;
    bool ok = yaml_parser_load(&p, doc), two = false;
    if (ok && yaml_document_get_root_node(doc)) {
        if (!(ok = yaml_parser_load(&p, &more))) yaml_document_delete(doc);
        else two = yaml_document_get_root_node(&more) != NULL, yaml_document_delete(&more);
    }
    if (!ok)
        fprintf(stderr, "llm3d %s: --config %s line %d column %d: YAML syntax: %s%s%s%s\n", cmd,
                path, (int)p.problem_mark.line + 1, (int)p.problem_mark.column + 1,
                p.problem ? p.problem : "unreadable", p.context ? " (" : "",
                p.context ? p.context : "", p.context ? ")" : "");
    else if (two)
        fprintf(stderr, "llm3d %s: --config %s holds more than one document (---): give one\n",
                cmd, path);
    if (ok && two) yaml_document_delete(doc);
    yaml_parser_delete(&p);
    fclose(f);
    return ok && !two ? -1 : 2;
}

int l3d_config_apply(const char *cmd, const char *path, const struct l3d_flag_group *g, int ng,
                     struct l3d_flags_given *given) {
    struct loaded *d = calloc(1, sizeof *d);
    L3D_ASSERT(d);
    int rc = load(cmd, path, &d->doc);
    if (rc >= 0) {
        free(d);
        return rc;
    }
    d->next = documents;
    documents = d;
    yaml_node_t *root = yaml_document_get_root_node(&d->doc);
    if (!root) return -1; /* empty, or comments only: no flags */
    struct reader *r = calloc(1, sizeof *r);
    L3D_ASSERT(r);
    *r = (struct reader){.cmd = cmd, .path = path, .g = g, .ng = ng, .doc = &d->doc,
                         .given = given};
    rc = apply_root(r, root);
    free(r);
    return rc;
}

/* ---- --help and writing ------------------------------------------------------------------ */

/* The distinct sections of the groups, in order, into out ("model:, layout:, ..."). */
static void section_list(const struct l3d_flag_group *g, int ng, char *out, size_t cap) {
    char sec[SECTION_CAP], done[512] = "", key[SECTION_CAP + 2];
    size_t k = 0;
    out[0] = '\0';
    for (int i = 0; i < ng; i++) {
        const char *s = l3d_config_section(g, i, sec, sizeof sec);
        snprintf(key, sizeof key, " %s ", s ? s : "");
        if (!s || strstr(done, key)) continue;
        strncat(done, key, sizeof done - strlen(done) - 1);
        k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s%s:", k ? ", " : "", s);
    }
}

void l3d_config_help(FILE *f, const struct l3d_flag_group *g, int ng) {
    char list[256], help[512];
    section_list(g, ng, list, sizeof list);
    if (list[0])
        snprintf(help, sizeof help, "the flags from a YAML file: `flag: value` lines (a switch: "
                 "true or false) in sections %s, or at the top level; flags given on the command "
                 "line override the file's (README, Config files)", list);
    else
        snprintf(help, sizeof help, "the flags from a YAML file: `flag: value` lines (a switch: "
                 "true or false); flags given on the command line override the file's (README, "
                 "Config files)");
    const struct l3d_flag config[] = {{"config", "FILE", 0, help}, {NULL, NULL, 0, NULL}};
    l3d_flags_help(f, &(struct l3d_flag_group){.title = "config file", .flags = config}, 1);
}

/* A value as YAML: plain when that reads back as the same text, else double-quoted. */
static void put_value(FILE *f, const char *v) {
    bool plain = *v && *v != '-' && strcmp(v, "~") && strcasecmp(v, "null");
    for (const char *p = v; plain && *p; p++)
        plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                strchr("._/+,=-", *p);
    if (plain) {
        fputs(v, f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* Whether the switch at pos gave way to its opposite (--X and --no-X), applied after it. */
static bool overridden(const struct l3d_flag_group *g, int ng, const struct l3d_flag *x,
                       const struct l3d_flags_given *given, int pos) {
    char other[128];
    if (x->arg) return false;
    if (strncmp(x->name, "no-", 3) == 0) snprintf(other, sizeof other, "%s", x->name + 3);
    else snprintf(other, sizeof other, "no-%s", x->name);
    int gi, op;
    return find_flag(other, g, ng, &gi, &op) && given->when[op] > given->when[pos];
}

/* The flags of the groups whose section is sec (NULL: the top level's), indented by ind. */
static void put_section(FILE *f, const struct l3d_flag_group *g, int ng, const char *sec,
                        const struct l3d_flags_given *given, const char *ind) {
    char s[SECTION_CAP];
    int pos = 0;
    for (int i = 0; i < ng; i++) {
        const char *own = l3d_config_section(g, i, s, sizeof s);
        bool mine = sec ? own && !strcmp(own, sec) : !own;
        for (const struct l3d_flag *x = g[i].flags; x->name; x++, pos++) {
            if (!mine || !x->help) continue; /* a retired spelling is never written */
            if (given->when[pos] && !overridden(g, ng, x, given, pos)) {
                fprintf(f, "%s%s: ", ind, x->name);
                put_value(f, x->arg ? given->val[pos] : "true");
                fputc('\n', f);
            } else {
                fprintf(f, "%s# %s: %s\n", ind, x->name, x->arg ? x->arg : "false");
            }
        }
    }
}

char *l3d_config_yaml(const char *cmd, const struct l3d_flag_group *g, int ng,
                      const struct l3d_flags_given *given) {
    char *buf = NULL, sec[SECTION_CAP], done[512] = "";
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    L3D_ASSERT(f);
    fprintf(f, "# The flags of this llm3d %s run, as a config file: `llm3d %s --config run.yaml` "
            "starts it\n# again (flags given there override this file's). Those not given are "
            "commented out:\n# their defaults are in `llm3d %s --help`. Paths are as given, "
            "from the directory the\n# run started in.\n", cmd, cmd, cmd);
    put_section(f, g, ng, NULL, given, "");
    for (int i = 0; i < ng; i++) {
        const char *s = l3d_config_section(g, i, sec, sizeof sec);
        char key[SECTION_CAP + 2];
        snprintf(key, sizeof key, " %s ", s ? s : "");
        if (!s || strstr(done, key)) continue; /* a section once, with all its groups */
        strncat(done, key, sizeof done - strlen(done) - 1);
        fprintf(f, "%s:\n", s);
        put_section(f, g, ng, s, given, "  ");
    }
    L3D_ASSERT(fclose(f) == 0);
    return buf;
}
