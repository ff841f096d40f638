/* System profiles: readable text files of device and link figures (format: profiles/README.md). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/plan.h"
#include "plan/profile-impl.h"

#ifndef L3D_SOURCE_DIR
#define L3D_SOURCE_DIR "."
#endif

double l3d_profile_peak(const struct l3d_profile *p, enum l3d_dtype t) {
    return t == L3D_F32 ? p->peak_fp32 : t == L3D_BF16 ? p->peak_bf16 : t == L3D_F16 ? p->peak_fp16
                                                                                   : 0.0;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

/* What no single line can say: keys missing, and keys that go together */
static l3d_status check_whole(const struct l3d_profile *p, const bool *seen, const char *what) {
    for (size_t k = 0; k < l3d_profile_n_keys; k++)
        if (!seen[k] && !l3d_profile_keys[k].optional)
            return l3d_error(L3D_ERR_FORMAT, "%s: key '%s' is missing (profiles/README.md "
                             "lists the keys)", what, l3d_profile_keys[k].name);
    if (p->peak_fp32 + p->peak_bf16 + p->peak_fp16 <= 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: every peak_tflops_* is 0", what);
    if (p->reserve_bytes >= p->mem_bytes)
        return l3d_error(L3D_ERR_FORMAT, "%s: reserve_gb %g leaves nothing of mem_gb %g: the "
                         "runtime's reserve must be less than the device's memory", what,
                         p->reserve_bytes / 1e9, p->mem_bytes / 1e9);
    if ((p->compute_units > 0) != (p->tile_m > 0))
        return l3d_error(L3D_ERR_FORMAT, "%s: compute_units and gemm_tile go together (wave "
                         "quantization needs both): give both or neither", what);
    for (int i = 0; i < 2; i++) {
        const struct l3d_profile_16 *m16 = &p->mixed[i];
        int given = (m16->n_eff > 0) + (m16->attn_eff > 0) + (m16->gemm_thread_eff > 0) +
                    (m16->kernel_bw_eff > 0);
        const char *t = i == 0 ? "bf16" : "fp16";
        if (given != 0 && given != 4)
            return l3d_error(L3D_ERR_FORMAT, "%s: gemm_eff_%s, attn_eff_%s, gemm_thread_eff_%s and "
                             "kernel_bw_eff_%s go together (llm3d bench --calibrate writes all "
                             "four): give all or none", what, t, t, t, t);
        if (given == 0 && m16->kern_eff[0] > 0)
            return l3d_error(L3D_ERR_FORMAT, "%s: kernel_bw_effs_%s needs gemm_eff_%s, "
                             "attn_eff_%s, gemm_thread_eff_%s and kernel_bw_eff_%s", what, t, t,
                             t, t, t);
        const char *alone = m16->wgrad.n > 0  ? "gemm_eff_wgrad"
                            : m16->grid.n > 0  ? "gemm_eff_grid"
                            : m16->exact.n > 0 ? "gemm_exact"
                                               : NULL;
        if (given == 0 && alone)
            return l3d_error(L3D_ERR_FORMAT, "%s: %s_%s needs gemm_eff_%s, attn_eff_%s, "
                             "gemm_thread_eff_%s and kernel_bw_eff_%s", what, alone, t, t, t, t,
                             t);
    }
    if (p->pair_size > p->devices_per_node)
        return l3d_error(L3D_ERR_FORMAT, "%s: pair_size %d exceeds devices_per_node %d", what,
                         p->pair_size, p->devices_per_node);
    if (p->devices_per_node > 1 && p->intra_bw <= 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: intra_bw_gbs must be positive with %d devices a node",
                         what, p->devices_per_node);
    if (p->pair_size > 1 && p->pair_bw <= 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: pair_bw_gbs must be positive with pair_size %d", what,
                         p->pair_size);
    return L3D_OK;
}

l3d_status l3d_profile_parse(struct l3d_profile *p, const char *text, const char *what) {
    memset(p, 0, sizeof *p);
    bool *seen = calloc(l3d_profile_n_keys, sizeof(bool));
    char *copy = strdup(text);
    if (!copy || !seen) {
        free(copy);
        free(seen);
        return l3d_error(L3D_ERR_OOM, "out of memory reading %s", what);
    }
    l3d_status st = L3D_OK;
    int line = 0;
    for (char *s = copy, *next; s && st == L3D_OK; s = next) {
        next = strchr(s, '\n');
        if (next) *next++ = '\0';
        line++;
        char *hash = strchr(s, '#');
        if (hash) *hash = '\0';
        s = trim(s);
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            st = l3d_error(L3D_ERR_FORMAT, "%s line %d: '%s' is not key = value", what, line, s);
            break;
        }
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        const struct l3d_profile_key *kk = l3d_profile_key_find(key);
        if (!kk) {
            st = l3d_error(L3D_ERR_FORMAT, "%s line %d: unknown key '%s' (profiles/README.md lists "
                           "the keys)", what, line, key);
            break;
        }
        size_t k = (size_t)(kk - l3d_profile_keys);
        if (seen[k]) {
            st = l3d_error(L3D_ERR_FORMAT, "%s line %d: '%s' given twice", what, line, key);
            break;
        }
        seen[k] = true;
        st = l3d_profile_key_read(p, kk, val, what, line);
    }
    free(copy);
    if (st == L3D_OK) st = check_whole(p, seen, what);
    free(seen);
    return st;
}

l3d_status l3d_profile_load(struct l3d_profile *p, const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return l3d_error(L3D_ERR_IO, "--profile %s is a directory: give a profile file (such as "
                         "%s%sNAME.prof) or a shipped name (frontier, dgx-a100, dgx-h100, h200)",
                         path, path, path[strlen(path) - 1] == '/' ? "" : "/");
    FILE *f;
    l3d_status ost = l3d_fopen_regular(path, "profile", &f, NULL);
    if (ost != L3D_OK) return ost;
    char *text = NULL;
    size_t len = 0, cap = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (len + 2 > cap) {
            cap = cap ? 2 * cap : 4096;
            if (cap > (1u << 20)) {
                free(text);
                fclose(f);
                return l3d_error(L3D_ERR_FORMAT, "profile %s is larger than 1 MiB", path);
            }
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return l3d_error(L3D_ERR_OOM, "out of memory reading %s", path);
            }
            text = t;
        }
        text[len++] = (char)c;
    }
    fclose(f);
    if (!text) return l3d_error(L3D_ERR_FORMAT, "profile %s is empty", path);
    text[len] = '\0';
    l3d_status st = l3d_profile_parse(p, text, path);
    free(text);
    return st;
}

l3d_status l3d_profile_find(struct l3d_profile *p, const char *name) {
    if (strchr(name, '/') || strchr(name, '.')) return l3d_profile_load(p, name);
    const char *env = getenv("L3D_PROFILE_DIR");
    const char *dirs[] = {env && *env ? env : NULL, "profiles", L3D_SOURCE_DIR "/profiles"};
    char path[4096];
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        snprintf(path, sizeof path, "%s/%s.prof", dirs[i], name);
        if (access(path, F_OK) != 0) continue;
        return l3d_profile_load(p, path);
    }
    if (strcmp(name, "local") == 0)
        return l3d_error(L3D_ERR_IO, "no profile 'local' yet: measure this machine with "
                         "`mpiexec -n 2 llm3d bench --calibrate --out profiles/local.prof`");
    return l3d_error(L3D_ERR_IO, "no profile '%s' in %s%s./profiles or %s/profiles: give --profile "
                     "a shipped name (frontier, dgx-a100, dgx-h100, h200) or a file path", name,
                     env && *env ? env : "", env && *env ? ", " : "", L3D_SOURCE_DIR);
}

double l3d_profile_gemm_eff(const struct l3d_profile *p, double flops) {
    if (p->n_eff == 0) return 1.0;
    if (flops <= p->eff_flops[0]) return p->eff[0];
    for (int i = 1; i < p->n_eff; i++)
        if (flops <= p->eff_flops[i]) {
            double x0 = log(p->eff_flops[i - 1]), x1 = log(p->eff_flops[i]);
            double w = (log(flops) - x0) / (x1 - x0);
            return p->eff[i - 1] + w * (p->eff[i] - p->eff[i - 1]);
        }
    return p->eff[p->n_eff - 1];
}

double l3d_profile_gemm_waves(const struct l3d_profile *p, double M, double N) {
    if (p->compute_units <= 0 || p->tile_m <= 0 || !(M >= 1) || !(N >= 1)) return 1.0;
    double best = 0, U = p->compute_units;
    for (int o = 0; o < 2; o++) {
        double tm = o ? p->tile_n : p->tile_m, tn = o ? p->tile_m : p->tile_n;
        double tiles = ceil(M / tm) * ceil(N / tn);
        /* fewer tiles than units: libraries pick smaller tiles or split K for such products
         * (the guide's "tile quantization"), left to the curve's small sizes */
        double q = tiles <= U ? 1.0 : tiles / (ceil(tiles / U) * U);
        if (q > best) best = q;
    }
    return best;
}

/* The curve's point i without its own cube's wave quantization, and no higher than any larger
 * point's: quantization aside, a larger product is not less efficient (it reuses each operand
 * over more of the others, the arithmetic intensity of Williams et al. 2009). Without that bound
 * an assumed point on a cube of badly filled waves (A100: 3684^3, 435 tiles in 5 waves of 108,
 * 0.81 of them) would stand for 0.97 of the peak, above the measured largest. */
static double point_free(const struct l3d_profile *p, int i) {
    if (p->compute_units <= 0) return p->eff[i]; /* no quantization: the curve as given */
    double best = INFINITY;
    for (int j = i; j < p->n_eff; j++) {
        double c = round(cbrt(p->eff_flops[j] / 2));
        double e = p->eff[j] / l3d_profile_gemm_waves(p, c, c);
        if (e < best) best = e;
    }
    return best;
}

/* Row `side` of the grid (its entries whose smallest side is `side`) at `flops`: linear in
 * log(flops) between the row's two entries around it (each without its own wave quantization),
 * flat beyond the row's ends. The entries need not be sorted. */
static double grid_row(const struct l3d_profile *p, const struct l3d_profile_grid *g, double side,
                       double flops) {
    int lo = -1, hi = -1;
    double flo = 0, fhi = 0;
    for (int i = 0; i < g->n; i++) {
        if (fmin(g->M[i], fmin(g->N[i], g->K[i])) != side) continue;
        double f = 2 * g->M[i] * g->N[i] * g->K[i];
        if (f <= flops && (lo < 0 || f > flo)) lo = i, flo = f;
        if (f >= flops && (hi < 0 || f < fhi)) hi = i, fhi = f;
    }
    double elo = lo < 0 ? 0 : g->eff[lo] / l3d_profile_gemm_waves(p, g->M[lo], g->N[lo]);
    double ehi = hi < 0 ? 0 : g->eff[hi] / l3d_profile_gemm_waves(p, g->M[hi], g->N[hi]);
    if (lo < 0) return ehi;
    if (hi < 0 || fhi == flo) return elo;
    double w = (log(flops) - log(flo)) / (log(fhi) - log(flo));
    return elo + w * (ehi - elo);
}

/* The grid at a product's smallest side and FLOPs: the rows (sides) just below and above it,
 * each at the FLOPs (grid_row), linear in log(side) between them; flat beyond the ends. Thin
 * products (a side of 64: a few tokens, a head's width) and square ones of the same FLOPs stay
 * apart, which a curve by FLOPs alone averages. */
static double grid_eff(const struct l3d_profile *p, double M, double N, double K) {
    const struct l3d_profile_grid *g = &p->grid;
    double side = fmin(M, fmin(N, K)), flops = 2 * M * N * K, below = 0, above = 0;
    for (int i = 0; i < g->n; i++) {
        double s = fmin(g->M[i], fmin(g->N[i], g->K[i]));
        if (s <= side && s > below) below = s;
        if (s >= side && (above == 0 || s < above)) above = s;
    }
    if (below == 0) return grid_row(p, g, above, flops);
    if (above == 0 || above == below) return grid_row(p, g, below, flops);
    double w = (log(side) - log(below)) / (log(above) - log(below));
    double e0 = grid_row(p, g, below, flops), e1 = grid_row(p, g, above, flops);
    return e0 + w * (e1 - e0);
}

double l3d_profile_gemm_eff_shape(const struct l3d_profile *p, double M, double N, double K) {
    double flops = 2 * M * N * K, q = l3d_profile_gemm_waves(p, M, N);
    if (p->grid.n > 0) return grid_eff(p, M, N, K) * q;
    if (p->n_eff == 0) return q;
    if (flops <= p->eff_flops[0]) return point_free(p, 0) * q;
    for (int i = 1; i < p->n_eff; i++)
        if (flops <= p->eff_flops[i]) {
            double x0 = log(p->eff_flops[i - 1]), x1 = log(p->eff_flops[i]);
            double w = (log(flops) - x0) / (x1 - x0);
            double e0 = point_free(p, i - 1), e1 = point_free(p, i);
            return (e0 + w * (e1 - e0)) * q;
        }
    return point_free(p, p->n_eff - 1) * q;
}

double l3d_profile_wgrad_eff(const struct l3d_profile *p, double M, double N, double K) {
    const struct l3d_profile_wgrad *w = &p->wgrad;
    if (w->n == 0) return l3d_profile_gemm_eff_shape(p, K, N, M);
    double q = l3d_profile_gemm_waves(p, K, N);
    if (M <= w->tokens[0]) return w->eff[0] * q;
    for (int i = 1; i < w->n; i++)
        if (M <= w->tokens[i]) {
            double x0 = log(w->tokens[i - 1]), x1 = log(w->tokens[i]);
            double f = (log(M) - x0) / (x1 - x0);
            return (w->eff[i - 1] + f * (w->eff[i] - w->eff[i - 1])) * q;
        }
    return w->eff[w->n - 1] * q;
}

bool l3d_profile_exact(const struct l3d_profile *p, double M, double N, double K, double *fwd,
                       double *wgrad) {
    const struct l3d_profile_exact *x = &p->exact;
    for (int i = 0; i < x->n; i++)
        if (x->M[i] == round(M) && x->N[i] == round(N) && x->K[i] == round(K)) {
            /* measured on this CPU, where there are no waves; a GPU profile's entries would have
             * them in already */
            *fwd = x->eff[i];
            *wgrad = x->wgrad[i];
            return true;
        }
    return false;
}

double l3d_profile_kern_eff(const struct l3d_profile *p, enum l3d_kern k) {
    return p->kern_eff[k] > 0 ? p->kern_eff[k] : p->kernel_bw_eff;
}

bool l3d_profile_mixed(const struct l3d_profile *p, enum l3d_dtype prec, struct l3d_profile *out) {
    *out = *p;
    if (prec == L3D_F32) return false;
    const struct l3d_profile_16 *m16 = &p->mixed[prec == L3D_BF16 ? 0 : 1];
    if (m16->n_eff <= 0) return false;
    out->n_eff = m16->n_eff;
    memcpy(out->eff_flops, m16->eff_flops, sizeof out->eff_flops);
    memcpy(out->eff, m16->eff, sizeof out->eff);
    out->wgrad = m16->wgrad; /* none: the type's gemm_eff_T covers the weight gradient too */
    out->grid = m16->grid;   /* the type's own shapes, or none (its gemm_eff_T) */
    out->exact = m16->exact;
    out->attn_eff = m16->attn_eff;
    out->gemm_thread_eff = m16->gemm_thread_eff;
    out->kernel_bw_eff = m16->kernel_bw_eff;
    /* the type's own kernels one by one, or its median for each (not the fp32 kernels') */
    memcpy(out->kern_eff, m16->kern_eff, sizeof out->kern_eff);
    return true;
}
