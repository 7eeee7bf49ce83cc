/* A small YAML tree with source marks, built from libyaml's event stream.
 *
 * libyaml's document API would build the tree too, but it cannot say where a
 * syntax error sits in the document's key structure, and it accepts duplicate
 * keys. This builder does both: syntax errors read
 * "<file>:<line>:<col>: <key path>: YAML syntax error: ...", duplicate keys are
 * errors, aliases and explicit tags are refused (a config file has no use for
 * them), and exactly one document is allowed. Scalars keep their text and
 * whether they were plain (only plain scalars may be numbers, booleans or null). */
#ifndef MM3_DEPLOY_YAML_H
#define MM3_DEPLOY_YAML_H

#include <stdbool.h>
#include <stddef.h>

enum mm3_yaml_kind { MM3_YAML_SCALAR, MM3_YAML_MAP, MM3_YAML_SEQ };

struct mm3_yaml_node {
    enum mm3_yaml_kind kind;
    int line, col; /* 1-based */
    char *text;    /* scalar text (NUL-terminated) */
    bool plain;    /* scalar written without quotes or block style */
    size_t n;      /* seq items or map pairs */
    size_t cap;
    struct mm3_yaml_node **keys;  /* map: key scalars */
    struct mm3_yaml_node **items; /* seq: items; map: values */
};

/* Parse `len` bytes. *root is NULL for an empty document. Returns 0 or -EINVAL
 * / -ENOMEM with the message set; `name` prefixes every message. */
int mm3_yaml_tree_parse(const char *text, size_t len, const char *name, struct mm3_yaml_node **root);
void mm3_yaml_tree_free(struct mm3_yaml_node *n);

/* Plain-scalar resolution of the YAML 1.2 core schema. */
bool mm3_yaml_is_null(const struct mm3_yaml_node *n);
/* 1 true, 0 false, -1 not a boolean. */
int mm3_yaml_bool(const struct mm3_yaml_node *n);
/* 0 and *out set, or -1 when not an integer that fits int64. */
int mm3_yaml_int(const struct mm3_yaml_node *n, long long *out);
/* 0 and *out set (integers too), or -1 when not a finite number. */
int mm3_yaml_number(const struct mm3_yaml_node *n, double *out);
/* "a mapping", "a list", "null", or the scalar text quoted, for messages. */
const char *mm3_yaml_describe(const struct mm3_yaml_node *n, char *buf, size_t cap);

#endif
