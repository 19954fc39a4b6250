/* SPDX-License-Identifier: MIT */
/* A small strict JSON reader for tests (RFC 8259: objects, arrays, strings
 * with escapes, numbers, true, false, null). It builds a tree; j_get finds an
 * object's member. Enough to validate a trace file without python. */
#ifndef SR_TESTS_JSON_CHECK_H
#define SR_TESTS_JSON_CHECK_H

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum j_type { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    enum j_type t;
    double num;        /* J_NUM, J_BOOL */
    char *str;         /* J_STR */
    size_t n;          /* J_ARR, J_OBJ: items */
    struct jv *items;  /* J_ARR, J_OBJ */
    char **keys;       /* J_OBJ */
} jv;

struct j_in {
    const char *p, *end;
    const char *err;
};

static void j_ws(struct j_in *in)
{
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\n' || *in->p == '\r' || *in->p == '\t'))
        in->p++;
}

static bool j_fail(struct j_in *in, const char *why)
{
    if (!in->err)
        in->err = why;
    return false;
}

static bool j_string(struct j_in *in, char **out)
{
    if (in->p >= in->end || *in->p != '"')
        return j_fail(in, "expected a string");
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    for (in->p++;; in->p++) {
        if (in->p >= in->end)
            return free(s), j_fail(in, "unterminated string");
        char c = *in->p;
        if (c == '"')
            break;
        if ((unsigned char)c < 0x20)
            return free(s), j_fail(in, "control character in a string");
        if (c == '\\') {
            if (++in->p >= in->end)
                return free(s), j_fail(in, "truncated escape");
            const char *esc = strchr("\"\\/bfnrtu", *in->p);
            if (!esc || !*in->p)
                return free(s), j_fail(in, "bad escape");
            if (*in->p == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (in->p + k >= in->end || !isxdigit((unsigned char)in->p[k]))
                        return free(s), j_fail(in, "bad \\u escape");
                in->p += 4;
                c = '?';
            } else {
                c = *in->p == 'n' ? '\n' : *in->p == 't' ? '\t' : *in->p;
            }
        }
        if (n + 2 > cap)
            s = realloc(s, cap *= 2);
        s[n++] = c;
    }
    in->p++;
    s[n] = '\0';
    *out = s;
    return true;
}

static bool j_number(struct j_in *in, double *out)
{
    const char *s = in->p;
    if (s < in->end && *s == '-')
        s++;
    if (s >= in->end || !isdigit((unsigned char)*s))
        return j_fail(in, "bad number");
    if (*s == '0' && s + 1 < in->end && isdigit((unsigned char)s[1]))
        return j_fail(in, "leading zero");
    while (s < in->end && isdigit((unsigned char)*s))
        s++;
    if (s < in->end && *s == '.') {
        if (++s >= in->end || !isdigit((unsigned char)*s))
            return j_fail(in, "bad fraction");
        while (s < in->end && isdigit((unsigned char)*s))
            s++;
    }
    if (s < in->end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < in->end && (*s == '+' || *s == '-'))
            s++;
        if (s >= in->end || !isdigit((unsigned char)*s))
            return j_fail(in, "bad exponent");
        while (s < in->end && isdigit((unsigned char)*s))
            s++;
    }
    *out = strtod(in->p, NULL);
    in->p = s;
    return true;
}

static bool j_value(struct j_in *in, jv *v, int depth);

static bool j_container(struct j_in *in, jv *v, int depth, bool obj)
{
    size_t cap = 0;
    v->t = obj ? J_OBJ : J_ARR;
    in->p++;
    j_ws(in);
    if (in->p < in->end && *in->p == (obj ? '}' : ']')) {
        in->p++;
        return true;
    }
    for (;;) {
        if (v->n == cap) {
            cap = cap ? 2 * cap : 8;
            v->items = realloc(v->items, cap * sizeof(*v->items));
            if (obj)
                v->keys = realloc(v->keys, cap * sizeof(*v->keys));
        }
        memset(&v->items[v->n], 0, sizeof(jv));
        j_ws(in);
        if (obj) {
            if (!j_string(in, &v->keys[v->n]))
                return false;
            j_ws(in);
            if (in->p >= in->end || *in->p++ != ':')
                return v->n++, j_fail(in, "expected ':'");
        }
        bool ok = j_value(in, &v->items[v->n], depth + 1);
        v->n++;
        if (!ok)
            return false;
        j_ws(in);
        if (in->p < in->end && *in->p == ',') {
            in->p++;
            continue;
        }
        if (in->p < in->end && *in->p == (obj ? '}' : ']')) {
            in->p++;
            return true;
        }
        return j_fail(in, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool j_word(struct j_in *in, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(in->end - in->p) < n || memcmp(in->p, w, n))
        return j_fail(in, "unexpected character");
    in->p += n;
    return true;
}

static bool j_value(struct j_in *in, jv *v, int depth)
{
    memset(v, 0, sizeof(*v));
    j_ws(in);
    if (depth > 64)
        return j_fail(in, "nested too deep");
    if (in->p >= in->end)
        return j_fail(in, "unexpected end");
    switch (*in->p) {
    case '{': return j_container(in, v, depth, true);
    case '[': return j_container(in, v, depth, false);
    case '"': v->t = J_STR; return j_string(in, &v->str);
    case 't': v->t = J_BOOL; v->num = 1; return j_word(in, "true");
    case 'f': v->t = J_BOOL; return j_word(in, "false");
    case 'n': v->t = J_NULL; return j_word(in, "null");
    default: v->t = J_NUM; return j_number(in, &v->num);
    }
}

static void j_free(jv *v)
{
    for (size_t i = 0; i < v->n; i++) {
        j_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

/* Parse a whole document: NULL on success, else the reason (and where, in *at). */
static const char *j_parse(const char *text, size_t len, jv *out, size_t *at)
{
    struct j_in in = {.p = text, .end = text + len};
    bool ok = j_value(&in, out, 0);
    j_ws(&in);
    if (ok && in.p != in.end)
        ok = j_fail(&in, "trailing characters");
    *at = (size_t)(in.p - text);
    return ok ? NULL : in.err;
}

static const jv *j_get(const jv *o, const char *key)
{
    for (size_t i = 0; o && o->t == J_OBJ && i < o->n; i++)
        if (!strcmp(o->keys[i], key))
            return &o->items[i];
    return NULL;
}

static const char *j_str(const jv *o, const char *key)
{
    const jv *v = j_get(o, key);
    return v && v->t == J_STR ? v->str : NULL;
}

#endif
