/*
 * Token-id test vectors (tests/data/tiktoken_NAME.tsv, hf_NAME.tsv: written by the npm oracles
 * scripts/tiktoken_vectors.js, scripts/hf_vectors.js, tests/cli/hftok_oracle.js): one case a line,
 * "mode \t hex of the text \t ids", mode o (special tokens' text is text) or s (it is the token).
 */
#ifndef L3D_TEST_TOKVEC_H
#define L3D_TEST_TOKVEC_H

#include <stdbool.h>
#include <stddef.h>

#include "llm3d/tokenizer.h"

/* One line into text (*n bytes, room for half the line), *mode and want (appended); false at a
 * malformed line. */
bool tokvec_parse_line(const char *line, unsigned char *text, size_t *n, char *mode,
                       struct l3d_ids *want);
bool tokvec_same(const struct l3d_ids *a, const struct l3d_ids *b);

#endif
