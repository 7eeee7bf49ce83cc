#include "common/deploy_yaml.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/error.h"
#include "common/log.h"

#define YAML_TREE_DEPTH_MAX 64

/* One open container while the events stream in. For a map, `key` is the key
 * whose value comes next (NULL between pairs). */
struct tree_frame {
    struct mm3_yaml_node *node;
    struct mm3_yaml_node *key;
};

struct tree_builder {
    const char *name;
    struct mm3_yaml_node *root;
    struct tree_frame stack[YAML_TREE_DEPTH_MAX];
    int depth;
    int documents;
};

static struct mm3_yaml_node *node_new(enum mm3_yaml_kind kind, yaml_mark_t mark)
{
    struct mm3_yaml_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = (int)mark.line + 1;
    n->col = (int)mark.column + 1;
    return n;
}

void mm3_yaml_tree_free(struct mm3_yaml_node *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) {
        if (n->kind == MM3_YAML_MAP) mm3_yaml_tree_free(n->keys[i]);
        mm3_yaml_tree_free(n->items[i]);
    }
    free(n->keys);
    free(n->items);
    free(n->text);
    free(n);
}

/* The key path of the innermost open container, e.g. "stages[0].devices".
 * Only the pairs / items being built count, so it names where the parser was. */
static void builder_path(const struct tree_builder *b, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < b->depth && len < cap; i++) {
        const struct tree_frame *f = &b->stack[i];
        bool inner = i + 1 < b->depth; /* a child container of this frame is open */
        int w = 0;
        if (f->node->kind == MM3_YAML_MAP) {
            const struct mm3_yaml_node *k = f->key;
            if (!k && inner && f->node->n) k = f->node->keys[f->node->n - 1];
            if (k) w = snprintf(buf + len, cap - len, "%s%s", len ? "." : "", k->text);
        } else if (inner && f->node->n) {
            w = snprintf(buf + len, cap - len, "[%zu]", f->node->n - 1);
        }
        if (w > 0) len += (size_t)w;
    }
    if (!buf[0]) snprintf(buf, cap, "(top level)");
}

static int node_push_pair(struct mm3_yaml_node *map, struct mm3_yaml_node *key, struct mm3_yaml_node *value)
{
    if (map->n == map->cap) {
        size_t cap = map->cap ? map->cap * 2 : 8;
        if (map->kind == MM3_YAML_MAP) {
            struct mm3_yaml_node **k = realloc(map->keys, cap * sizeof *k);
            if (!k) return -ENOMEM;
            map->keys = k;
        }
        struct mm3_yaml_node **v = realloc(map->items, cap * sizeof *v);
        if (!v) return -ENOMEM;
        map->items = v;
        map->cap = cap;
    }
    if (map->kind == MM3_YAML_MAP) map->keys[map->n] = key;
    map->items[map->n++] = value;
    return 0;
}

/* Attach a finished-or-opening node to the innermost container. Takes
 * ownership of `n` in every case. */
static int builder_attach(struct tree_builder *b, struct mm3_yaml_node *n)
{
    char path[512];
    if (b->depth == 0) {
        CHECK(!b->root);
        b->root = n;
        return 0;
    }
    struct tree_frame *f = &b->stack[b->depth - 1];
    if (f->node->kind == MM3_YAML_SEQ) {
        if (node_push_pair(f->node, NULL, n) < 0) {
            mm3_yaml_tree_free(n);
            return mm3_errorf(-ENOMEM, "%s: out of memory", b->name);
        }
        return 0;
    }
    if (!f->key) {
        if (n->kind != MM3_YAML_SCALAR) {
            builder_path(b, path, sizeof path);
            int line = n->line, col = n->col;
            mm3_yaml_tree_free(n);
            return mm3_errorf(-EINVAL, "%s:%d:%d: %s: a key must be a plain word, not a mapping or list", b->name, line,
                              col, path);
        }
        for (size_t i = 0; i < f->node->n; i++) {
            if (strcmp(f->node->keys[i]->text, n->text) == 0) {
                builder_path(b, path, sizeof path);
                bool top = b->depth == 1;
                int rc = mm3_errorf(-EINVAL, "%s:%d:%d: %s%s%s: duplicate key (first set at line %d)", b->name, n->line,
                                    n->col, top ? "" : path, top ? "" : ".", n->text, f->node->keys[i]->line);
                mm3_yaml_tree_free(n);
                return rc;
            }
        }
        f->key = n;
        return 0;
    }
    struct mm3_yaml_node *key = f->key;
    f->key = NULL;
    if (node_push_pair(f->node, key, n) < 0) {
        mm3_yaml_tree_free(key);
        mm3_yaml_tree_free(n);
        return mm3_errorf(-ENOMEM, "%s: out of memory", b->name);
    }
    return 0;
}

static int builder_open(struct tree_builder *b, enum mm3_yaml_kind kind, yaml_mark_t mark)
{
    char path[512];
    if (b->depth == YAML_TREE_DEPTH_MAX) {
        builder_path(b, path, sizeof path);
        return mm3_errorf(-EINVAL, "%s:%d:%d: %s: nesting deeper than %d levels", b->name, (int)mark.line + 1,
                          (int)mark.column + 1, path, YAML_TREE_DEPTH_MAX);
    }
    struct mm3_yaml_node *n = node_new(kind, mark);
    if (!n) return mm3_errorf(-ENOMEM, "%s: out of memory", b->name);
    int rc = builder_attach(b, n);
    if (rc < 0) return rc;
    b->stack[b->depth].node = n;
    b->stack[b->depth].key = NULL;
    b->depth++;
    return 0;
}

static int builder_event(struct tree_builder *b, const yaml_event_t *ev)
{
    char path[512];
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++b->documents > 1) {
            return mm3_errorf(-EINVAL,
                              "%s:%d:%d: (top level): a deploy file holds one YAML document, "
                              "found a second one",
                              b->name, line, col);
        }
        return 0;
    case YAML_ALIAS_EVENT:
        builder_path(b, path, sizeof path);
        return mm3_errorf(-EINVAL, "%s:%d:%d: %s: aliases (*%s) are not supported; write the value out", b->name, line,
                          col, path, (const char *)ev->data.alias.anchor);
    case YAML_SCALAR_EVENT: {
        if (ev->data.scalar.tag && !ev->data.scalar.plain_implicit && !ev->data.scalar.quoted_implicit) {
            builder_path(b, path, sizeof path);
            return mm3_errorf(-EINVAL, "%s:%d:%d: %s: explicit tags (%s) are not supported", b->name, line, col, path,
                              (const char *)ev->data.scalar.tag);
        }
        struct mm3_yaml_node *n = node_new(MM3_YAML_SCALAR, ev->start_mark);
        if (!n) return mm3_errorf(-ENOMEM, "%s: out of memory", b->name);
        n->text = strndup((const char *)ev->data.scalar.value, ev->data.scalar.length);
        if (!n->text) {
            free(n);
            return mm3_errorf(-ENOMEM, "%s: out of memory", b->name);
        }
        if (strlen(n->text) != ev->data.scalar.length) {
            builder_path(b, path, sizeof path);
            mm3_yaml_tree_free(n);
            return mm3_errorf(-EINVAL, "%s:%d:%d: %s: scalar contains a NUL character", b->name, line, col, path);
        }
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        return builder_attach(b, n);
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        const yaml_char_t *tag =
            ev->type == YAML_SEQUENCE_START_EVENT ? ev->data.sequence_start.tag : ev->data.mapping_start.tag;
        int implicit =
            ev->type == YAML_SEQUENCE_START_EVENT ? ev->data.sequence_start.implicit : ev->data.mapping_start.implicit;
        if (tag && !implicit) {
            builder_path(b, path, sizeof path);
            return mm3_errorf(-EINVAL, "%s:%d:%d: %s: explicit tags (%s) are not supported", b->name, line, col, path,
                              (const char *)tag);
        }
        return builder_open(b, ev->type == YAML_SEQUENCE_START_EVENT ? MM3_YAML_SEQ : MM3_YAML_MAP, ev->start_mark);
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        CHECK(b->depth > 0);
        b->depth--;
        return 0;
    default:
        return 0;
    }
}

int mm3_yaml_tree_parse(const char *text, size_t len, const char *name, struct mm3_yaml_node **root)
{
    *root = NULL;
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return mm3_errorf(-ENOMEM, "%s: out of memory", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yaml_parser_set_encoding(&parser, YAML_UTF8_ENCODING);

    struct tree_builder b = {.name = name};
    int rc = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            char path[512];
            builder_path(&b, path, sizeof path);
            const char *problem = parser.problem ? parser.problem : "malformed YAML";
            if (parser.context) {
                rc = mm3_errorf(-EINVAL, "%s:%d:%d: %s: YAML syntax error: %s (%s, which began at line %d)", name,
                                (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1, path, problem,
                                parser.context, (int)parser.context_mark.line + 1);
            } else {
                rc = mm3_errorf(-EINVAL, "%s:%d:%d: %s: YAML syntax error: %s", name, (int)parser.problem_mark.line + 1,
                                (int)parser.problem_mark.column + 1, path, problem);
            }
            break;
        }
        bool end = ev.type == YAML_STREAM_END_EVENT;
        rc = builder_event(&b, &ev);
        yaml_event_delete(&ev);
        if (rc < 0 || end) break;
    }
    yaml_parser_delete(&parser);
    /* Open frames point into the tree, which root owns; only a key still
     * waiting for its value belongs to nobody yet. */
    if (rc < 0) {
        for (int i = 0; i < b.depth; i++)
            mm3_yaml_tree_free(b.stack[i].key);
        mm3_yaml_tree_free(b.root);
        return rc;
    }
    *root = b.root;
    return 0;
}

bool mm3_yaml_is_null(const struct mm3_yaml_node *n)
{
    if (n->kind != MM3_YAML_SCALAR || !n->plain) return false;
    const char *t = n->text;
    return !*t || !strcmp(t, "~") || !strcmp(t, "null") || !strcmp(t, "Null") || !strcmp(t, "NULL");
}

int mm3_yaml_bool(const struct mm3_yaml_node *n)
{
    if (n->kind != MM3_YAML_SCALAR || !n->plain) return -1;
    const char *t = n->text;
    if (!strcmp(t, "true") || !strcmp(t, "True") || !strcmp(t, "TRUE")) return 1;
    if (!strcmp(t, "false") || !strcmp(t, "False") || !strcmp(t, "FALSE")) return 0;
    return -1;
}

int mm3_yaml_int(const struct mm3_yaml_node *n, long long *out)
{
    if (n->kind != MM3_YAML_SCALAR || !n->plain) return -1;
    const char *t = n->text;
    const char *p = t + (*t == '-' || *t == '+');
    if (!*p) return -1;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return -1;
    errno = 0;
    long long v = strtoll(t, NULL, 10);
    if (errno == ERANGE) return -1;
    *out = v;
    return 0;
}

int mm3_yaml_number(const struct mm3_yaml_node *n, double *out)
{
    if (n->kind != MM3_YAML_SCALAR || !n->plain) return -1;
    /* Core-schema float: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
     * (.inf and .nan are not finite, so they are refused with the rest). */
    const char *p = n->text;
    if (*p == '-' || *p == '+') p++;
    int digits = 0;
    while (isdigit((unsigned char)*p))
        p++, digits++;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p))
            p++, digits++;
    }
    if (!digits) return -1;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '-' || *p == '+') p++;
        if (!isdigit((unsigned char)*p)) return -1;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (*p) return -1;
    double v = strtod(n->text, NULL);
    if (!isfinite(v)) return -1;
    *out = v;
    return 0;
}

const char *mm3_yaml_describe(const struct mm3_yaml_node *n, char *buf, size_t cap)
{
    if (n->kind == MM3_YAML_MAP) return "a mapping";
    if (n->kind == MM3_YAML_SEQ) return "a list";
    if (mm3_yaml_is_null(n)) return "null";
    if (strlen(n->text) > 64)
        snprintf(buf, cap, "'%.61s...'", n->text);
    else
        snprintf(buf, cap, "'%s'", n->text);
    return buf;
}
