/* The profile format's one description (src/plan/profile_keys.c): every key, its kind, where its
 * value lives in struct l3d_profile, its unit, its range, whether it may be left out, and how a
 * value is written. The parser (src/plan/profile.c) reads through it and the calibration's writer
 * (src/plan/calibrate_write.c) writes through it, so a key is written in the form it is read.
 *
 *   const struct l3d_profile_key *k = l3d_profile_key_find("gemm_thread_eff");
 *   char val[64], note[256];
 *   l3d_profile_key_format(&prof, k, NULL, val, sizeof val, note, sizeof note);
 *   // val "1.500", note "gemm_thread_eff: measured 1.822 (above 1.5), written as 1.500" when
 *   // prof held 1.822
 */
#ifndef LLM3D_PROFILE_IMPL_H
#define LLM3D_PROFILE_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "llm3d/plan.h"

enum l3d_profile_kind {
    L3D_PK_TEXT,  /* free text to the line's end (no '#': that starts a comment) */
    L3D_PK_NUM,   /* a number in the file's unit: value x scale in SI units */
    L3D_PK_INT,   /* an integer from 1 to hi */
    L3D_PK_BOOL,  /* yes / no (1 / 0) */
    L3D_PK_FRAC,  /* yes (1), no (0) or a fraction from 0 to hi */
    L3D_PK_EFF,   /* flops:fraction points, increasing flops (an efficiency curve) */
    L3D_PK_WGRAD, /* tokens:fraction points, increasing tokens */
    L3D_PK_TILE,  /* MxN, each from 1 to hi */
    L3D_PK_KERN,  /* layernorm:F gelu:F residual:F adamw:F, each fraction in (0, hi] */
    L3D_PK_GRID,  /* MxNxK:fraction entries, each shape once (products by shape) */
    L3D_PK_EXACT, /* MxNxK:F/W entries, each shape once (a model's linear layers) */
};

/* The range of a number in the file's units: above 0 (positive) or from 0, at most hi. The
 * ranges are generous bounds on any device of the next decade (a 1e308 peak, memory or latency
 * is a typo, and would overflow the planner's arithmetic), not a judgement of the figures. */
struct l3d_profile_key {
    const char *name;
    enum l3d_profile_kind kind;
    size_t off;        /* where the value lives in struct l3d_profile (for the curves of
                        * L3D_PK_EFF, the struct l3d_profile_16 it starts; 0: the fp32 curve;
                        * L3D_PK_GRID, _EXACT: their struct) */
    double scale;      /* L3D_PK_NUM: SI units of one file unit */
    bool positive;     /* must be > 0 (else >= 0) */
    double hi;         /* largest value, in the file's unit; L3D_PK_TEXT: the field's size */
    bool optional;     /* may be left out (then 0) */
    const char *fmt;   /* printf format of a number (L3D_PK_NUM, _FRAC) or a fraction (the
                        * curves, L3D_PK_KERN) as the writer writes it */
};

extern const struct l3d_profile_key l3d_profile_keys[];
extern const size_t l3d_profile_n_keys;

/* The key named `name`; NULL if none */
const struct l3d_profile_key *l3d_profile_key_find(const char *name);

/* Reads one value (text `val`, modified) into p; L3D_ERR_FORMAT naming what, the line, the key,
 * the value and the range. */
l3d_status l3d_profile_key_read(struct l3d_profile *p, const struct l3d_profile_key *k, char *val,
                                const char *what, int line);

/* The smallest value written for a figure that must be above 0 and was not: the least that the
 * writer's three decimals keep */
#define L3D_PROFILE_FLOOR 0.001

/* What a writer of measured figures knows beyond a key's range */
struct l3d_profile_measured {
    bool positive; /* a rate or a time: 0 or below is a failed measurement, not the "none" a 0
                    * means in a profile */
    double hi;     /* a physical bound below the key's (a number's), 0: none */
};

/* Writes k's value from p into val (n bytes) as l3d_profile_key_read reads it. A figure that
 * read would refuse, or outside m's range (m NULL: the key's alone), is written as the nearest
 * value in range: NaN, or at or below 0 where the figure must be positive, as L3D_PROFILE_FLOOR
 * (0 where 0 is allowed); above the bound as the bound; a curve's point whose flops or tokens are
 * not above the last written point's is left out; '#' and line breaks in text become spaces.
 * Then note (nn bytes) says, on one line without '#', "KEY: measured V (why), written as W" for
 * each such figure, and true is returned; else note is "" and false. */
bool l3d_profile_key_format(const struct l3d_profile *p, const struct l3d_profile_key *k,
                            const struct l3d_profile_measured *m, char *val, size_t n, char *note,
                            size_t nn);

#endif
