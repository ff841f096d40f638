/*
 * A JSON reader (RFC 8259) for the files llm3d takes from other tools: Hugging Face config.json,
 * tokenizer.json and safetensors headers, run metrics (metrics.jsonl, one document per line) and
 * Perfetto traces. The whole document becomes a tree of values; strings are decoded to UTF-8
 * (escapes and surrogate pairs resolved, NUL-terminated, their length kept since "\u0000" is
 * legal).
 *
 *   struct l3d_json doc;
 *   if (l3d_json_parse(&doc, text, len, "model/config.json") != L3D_OK) return error;
 *   int64_t layers;
 *   const struct l3d_json *v = l3d_json_get(&doc, "num_hidden_layers");
 *   if (!v || !l3d_json_int(v, &layers)) ... "num_hidden_layers: missing or not an integer"
 *   l3d_json_free(&doc);
 *
 * Errors name the file (`what`), the line and column and what was expected. Strict: no comments,
 * no trailing commas, no NaN/Infinity literals, no bytes after the document; objects nest at
 * most L3D_JSON_MAX_DEPTH deep (a hostile file cannot exhaust the stack); a key repeated in one
 * object is refused, naming both places (readers disagree on which counts: Python's json takes
 * the last), checked in linear time (a hash table past 16 keys).
 */
#ifndef LLM3D_JSON_H
#define LLM3D_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm3d/core.h"

#define L3D_JSON_MAX_DEPTH 256

enum l3d_json_type {
    L3D_JSON_NULL,
    L3D_JSON_BOOL,
    L3D_JSON_NUMBER,
    L3D_JSON_STRING,
    L3D_JSON_ARRAY,
    L3D_JSON_OBJECT,
};

struct l3d_json {
    enum l3d_json_type type;
    bool boolean;            /* BOOL */
    double number;           /* NUMBER (as strtod reads its text) */
    char *str;               /* STRING: decoded, NUL-terminated; NUMBER: its text as written */
    size_t len;              /* bytes of str */
    size_t count;            /* ARRAY: elements; OBJECT: members */
    struct l3d_json *items;  /* ARRAY: the elements; OBJECT: the values, in file order */
    struct l3d_json *keys;   /* OBJECT: the keys (STRING values), keys[i] names items[i] */
    size_t offset;           /* byte offset of the value in the text, for messages */
};

/* Parses text[0, len) as one JSON document into *out (freed with l3d_json_free, also after an
 * error, which leaves *out a NULL value). */
l3d_status l3d_json_parse(struct l3d_json *out, const char *text, size_t len, const char *what);
void l3d_json_free(struct l3d_json *v);

/* Member `key` of an object; NULL when v is not an object or has none. */
const struct l3d_json *l3d_json_get(const struct l3d_json *v, const char *key);
/* The value as an integer: true when it is a number with no fraction in [INT64_MIN, INT64_MAX]
 * written without a fraction or exponent that leaves one ("4096", "4.096e3" yes; "1.5" no). */
bool l3d_json_int(const struct l3d_json *v, int64_t *out);
/* The value as a double: true when it is a number. */
bool l3d_json_num(const struct l3d_json *v, double *out);
/* The value as a string: NULL unless it is one. */
const char *l3d_json_str(const struct l3d_json *v);
/* "object", "array", ... for messages. */
const char *l3d_json_type_name(enum l3d_json_type t);
/* 1-based line and column of a byte offset of text (for messages about a value's content). */
void l3d_json_where(const char *text, size_t len, size_t offset, int *line, int *col);

#endif
