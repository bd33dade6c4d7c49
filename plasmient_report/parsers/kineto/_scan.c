/* Kineto events → columns, natively: the typed decode's inner loop (decode.py) in C.

   scan(data, fields) reads `data`, the bytes of one JSON array of trace events (a run the splitter cut), and
   returns, for every field asked for, one column over all the events: a type code per event and the values
   (int64, float64, or offsets + bytes of decoded strings / raw JSON). It returns None whenever the run is not
   one the columns can hold exactly as msgspec's strict Structs would read it: invalid JSON or UTF-8, an event
   that is no object, `args` that is no object, a value of another JSON type than its field's, an integer out of
   int64, a number beyond double, a key written with escapes, a key given twice, nesting deeper than 512. The
   caller then decodes that run with msgspec, as before: this code is only ever a faster way to the same
   columns, never a second reading of a trace. The scan runs without the GIL.

   fields: a sequence of (key: bytes, kind: int, in_args: bool); kind 0 text (a JSON string; an integer is
   msgspec's other type there, `str | int`), 1 int (`int | str`), 2 float (a number, `float | str`), 3 raw (any
   JSON value, kept as its bytes), 4 strict text (`str`). Result: (n_events, [column, ...]) where a column is
   (types: bytes[n], values: bytes[8n], kinds) for int / float fields and (types, offsets: bytes[8(n+1)],
   data: bytes, kinds) for text / raw fields, `kinds` the type codes present (bit t set for type t). Types: 0 absent, 1 null, 2 integer, 3 other number, 4 string, 5 true / false, 6 array,
   7 object, 8 an integer beyond int64. A value of its field's other type (a string in an int field, an integer
   in a text field, any big integer) is typed but not kept: the caller decodes the run with msgspec when a
   table it builds reads one (its column is then JSON text). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { K_TEXT = 0, K_INT = 1, K_FLOAT = 2, K_RAW = 3, K_STRICT_TEXT = 4 };
enum { T_ABSENT = 0, T_NULL = 1, T_INT = 2, T_NUMBER = 3, T_STRING = 4, T_BOOL = 5, T_ARRAY = 6, T_OBJECT = 7, T_BIG = 8 };
#define MAX_FIELDS 96
#define MAX_DEPTH 512
#define MAX_KEY 64
#define SET_TYPE(f, i, t) ((f)->kinds |= 1u << (t), (f)->types[i] = (uint8_t)(t))

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

typedef struct {
    const char *key;
    Py_ssize_t klen;
    int kind;
    int in_args;
    uint8_t *types;
    int64_t *nums; /* int64 or double bits */
    int64_t *offs; /* n + 1 */
    Buf data;
    Py_ssize_t seen; /* the last event that had it (a key given twice fails) */
    unsigned kinds;  /* the type codes seen (bit t) */
} Field;

typedef struct {
    const unsigned char *p, *end;
    int fail;
    Field *fields;
    int nfields;
    int top[MAX_FIELDS], ntop; /* indexes of event-level fields, by key length (top_at[len] .. top_at[len + 1]) */
    int arg[MAX_FIELDS], narg; /* indexes of args fields, likewise */
    int top_at[MAX_KEY + 2], arg_at[MAX_KEY + 2];
    Py_ssize_t n, cap;         /* events read, rows allocated */
} Scan;

static int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

static int grow(Scan *s) {
    Py_ssize_t cap = s->cap ? s->cap * 2 : 1024;
    for (int i = 0; i < s->nfields; i++) {
        Field *f = &s->fields[i];
        uint8_t *t = realloc(f->types, (size_t)cap);
        if (!t) return -1;
        f->types = t;
        memset(t + s->cap, 0, (size_t)(cap - s->cap));
        if (f->kind == K_INT || f->kind == K_FLOAT) {
            int64_t *v = realloc(f->nums, sizeof(int64_t) * (size_t)cap);
            if (!v) return -1;
            f->nums = v;
            memset(v + s->cap, 0, sizeof(int64_t) * (size_t)(cap - s->cap));
        } else {
            int64_t *o = realloc(f->offs, sizeof(int64_t) * (size_t)(cap + 1));
            if (!o) return -1;
            if (s->cap == 0) o[0] = 0;
            f->offs = o;
        }
    }
    s->cap = cap;
    return 0;
}

static inline void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const unsigned char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* A multi-byte UTF-8 sequence at p (p[0] >= 0x80): its length, 0 when invalid (overlong, surrogate, > U+10FFFF). */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (end - p < 2 || (p[1] & 0xC0) != 0x80) return 0;
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;
        if (c == 0xED && p[1] >= 0xA0) return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

static int put_utf8(Buf *b, unsigned cp) {
    if (buf_reserve(b, 4)) return -1;
    char *o = b->data + b->len;
    if (cp < 0x80) {
        o[0] = (char)cp;
        b->len += 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        b->len += 2;
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        b->len += 3;
    } else {
        o[0] = (char)(0xF0 | (cp >> 18));
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        b->len += 4;
    }
    return 0;
}

/* A string at s->p (on its opening quote), checked; decoded into `out` when given. Sets *escaped when it holds a
   backslash. Returns 0, or -1 (s->fail set). */
static int string(Scan *s, Buf *out, int *escaped) {
    const unsigned char *p = s->p + 1, *end = s->end;
    int esc = 0;
    for (;;) {
        const unsigned char *run = p;
        while (p < end && *p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x80) p++;
        if (out && p > run) {
            if (buf_reserve(out, (size_t)(p - run))) goto fail;
            memcpy(out->data + out->len, run, (size_t)(p - run));
            out->len += (size_t)(p - run);
        }
        if (p >= end) goto fail;
        unsigned char c = *p;
        if (c == '"') {
            s->p = p + 1;
            if (escaped) *escaped = esc;
            return 0;
        }
        if (c < 0x20) goto fail;
        if (c >= 0x80) {
            int k = utf8_len(p, end);
            if (!k) goto fail;
            if (out) {
                if (buf_reserve(out, (size_t)k)) goto fail;
                memcpy(out->data + out->len, p, (size_t)k);
                out->len += (size_t)k;
            }
            p += k;
            continue;
        }
        /* a backslash */
        esc = 1;
        if (end - p < 2) goto fail;
        unsigned char e = p[1];
        unsigned cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            if (end - p < 6) goto fail;
            int v = hex4(p + 2);
            if (v < 0) goto fail;
            if (v >= 0xD800 && v <= 0xDBFF) { /* a pair, else fail (msgspec refuses a lone one) */
                if (end - p < 12 || p[6] != '\\' || p[7] != 'u') goto fail;
                int lo = hex4(p + 8);
                if (lo < 0xDC00 || lo > 0xDFFF) goto fail;
                cp = 0x10000 + (((unsigned)v - 0xD800) << 10) + ((unsigned)lo - 0xDC00);
                p += 6;
            } else if (v >= 0xDC00 && v <= 0xDFFF) {
                goto fail;
            } else {
                cp = (unsigned)v;
            }
            p += 4;
            break;
        }
        default: goto fail;
        }
        p += 2;
        if (out && put_utf8(out, cp)) goto fail;
    }
fail:
    s->fail = 1;
    return -1;
}

/* A number at s->p. *is_int: no fraction and no exponent; *ival set when it is an integer that fits int64
   (*big otherwise); *dval its double value (an integer's is that of its int64, as Python's float(int) gives;
   a big integer's is not computed). Returns 0, or -1 (s->fail set) on a malformed or out-of-range number. */
static int number(Scan *s, int want_double, int *is_int, int *big, int64_t *ival, double *dval) {
    const unsigned char *p = s->p, *start = p, *end = s->end;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end) goto fail;
    const unsigned char *digits = p;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        goto fail;
    }
    const unsigned char *int_end = p;
    int frac = 0, exp = 0;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') goto fail;
        while (p < end && *p >= '0' && *p <= '9') p++;
        frac = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') goto fail;
        while (p < end && *p >= '0' && *p <= '9') p++;
        exp = 1;
    }
    s->p = p;
    *is_int = !frac && !exp;
    *big = 0;
    if (*is_int) {
        uint64_t m = 0;
        int ndig = (int)(int_end - digits);
        if (ndig > 19) {
            *big = 1;
        } else {
            for (const unsigned char *q = digits; q < int_end; q++) m = m * 10 + (uint64_t)(*q - '0');
            if (!*big) {
                if (neg) {
                    if (m > (uint64_t)INT64_MAX + 1) *big = 1;
                    else *ival = (m == (uint64_t)INT64_MAX + 1) ? INT64_MIN : -(int64_t)m;
                } else {
                    if (m > (uint64_t)INT64_MAX) *big = 1;
                    else *ival = (int64_t)m;
                }
            }
        }
        if (!*big) *dval = (double)*ival;
        return 0;
    }
    if (want_double) {
        /* Clinger's fast path: a mantissa of at most 2^53 and a power of ten of at most 22 are exact doubles, so
           one multiplication or division of them is the correctly rounded value (what strtod gives, faster). */
        uint64_t m = 0;
        int nd = 0, e10 = 0, ok = 1;
        const unsigned char *q = digits;
        for (; q < p && *q >= '0' && *q <= '9'; q++) {
            if (nd || *q != '0') nd++;
            m = m * 10 + (uint64_t)(*q - '0');
        }
        if (q < p && *q == '.') {
            for (q++; q < p && *q >= '0' && *q <= '9'; q++) {
                if (nd || *q != '0') nd++;
                m = m * 10 + (uint64_t)(*q - '0');
                e10--;
            }
        }
        if (q < p) { /* an exponent */
            int eneg = 0, ev = 0;
            q++;
            if (*q == '+' || *q == '-') eneg = *q++ == '-';
            for (; q < p; q++) {
                if (ev > 10000) { ok = 0; break; }
                ev = ev * 10 + (*q - '0');
            }
            e10 += eneg ? -ev : ev;
        }
        static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                       1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
        if (ok && nd <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
            double d = (double)m;
            d = e10 < 0 ? d / pow10[-e10] : d * pow10[e10];
            *dval = neg ? -d : d;
            return 0;
        }
        char tmp[72];
        size_t len = (size_t)(p - start);
        if (len >= sizeof tmp) goto fail;
        memcpy(tmp, start, len);
        tmp[len] = 0;
        char *stop;
        errno = 0;
        double d = strtod(tmp, &stop);
        if (stop != tmp + len || errno == ERANGE || !isfinite(d)) goto fail;
        *dval = d;
    }
    return 0;
fail:
    s->fail = 1;
    return -1;
}

static int value_skip(Scan *s, int depth);

/* Any JSON value, checked and skipped; returns its type code, -1 on failure. */
static int value_skip(Scan *s, int depth) {
    if (depth > MAX_DEPTH) {
        s->fail = 1;
        return -1;
    }
    ws(s);
    if (s->p >= s->end) {
        s->fail = 1;
        return -1;
    }
    unsigned char c = *s->p;
    if (c == '"') {
        return string(s, NULL, NULL) ? -1 : T_STRING;
    }
    if (c == '{') {
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return T_OBJECT;
        }
        for (;;) {
            ws(s);
            if (s->p >= s->end || *s->p != '"' || string(s, NULL, NULL)) goto fail;
            ws(s);
            if (s->p >= s->end || *s->p != ':') goto fail;
            s->p++;
            if (value_skip(s, depth + 1) < 0) return -1;
            ws(s);
            if (s->p >= s->end) goto fail;
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p == '}') {
                s->p++;
                return T_OBJECT;
            }
            goto fail;
        }
    }
    if (c == '[') {
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return T_ARRAY;
        }
        for (;;) {
            if (value_skip(s, depth + 1) < 0) return -1;
            ws(s);
            if (s->p >= s->end) goto fail;
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p == ']') {
                s->p++;
                return T_ARRAY;
            }
            goto fail;
        }
    }
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t len = strlen(word);
        if ((size_t)(s->end - s->p) < len || memcmp(s->p, word, len) != 0) goto fail;
        s->p += len;
        return c == 'n' ? T_NULL : T_BOOL;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int is_int, big;
        int64_t iv;
        double dv;
        if (number(s, 0, &is_int, &big, &iv, &dv)) return -1;
        return is_int ? T_INT : T_NUMBER;
    }
fail:
    s->fail = 1;
    return -1;
}

/* The value of a wanted field into its column for event i. */
static int field_value(Scan *s, Field *f, Py_ssize_t i) {
    if (f->seen == i) goto fail; /* a key given twice */
    f->seen = i;
    ws(s);
    if (s->p >= s->end) goto fail;
    unsigned char c = *s->p;
    if (c == 'n') {
        if (s->end - s->p < 4 || memcmp(s->p, "null", 4) != 0) goto fail;
        s->p += 4;
        SET_TYPE(f, i, T_NULL);
        return 0;
    }
    switch (f->kind) {
    case K_TEXT:
    case K_STRICT_TEXT:
        if (c == '"') {
            if (string(s, &f->data, NULL)) return -1;
            SET_TYPE(f, i, T_STRING);
            return 0;
        }
        if (f->kind == K_TEXT && (c == '-' || (c >= '0' && c <= '9'))) { /* msgspec's other type: not kept */
            int is_int, big;
            int64_t iv;
            double dv;
            if (number(s, 0, &is_int, &big, &iv, &dv)) return -1;
            if (!is_int) goto fail;
            SET_TYPE(f, i, big ? T_BIG : T_INT);
            return 0;
        }
        goto fail;
    case K_INT:
    case K_FLOAT: {
        if (c == '"') { /* msgspec's other type: not kept */
            if (string(s, NULL, NULL)) return -1;
            SET_TYPE(f, i, T_STRING);
            return 0;
        }
        if (!(c == '-' || (c >= '0' && c <= '9'))) goto fail;
        int is_int, big;
        int64_t iv = 0;
        double dv = 0;
        if (number(s, f->kind == K_FLOAT, &is_int, &big, &iv, &dv)) return -1;
        if (f->kind == K_INT && !is_int) goto fail; /* a float where a count belongs: msgspec refuses it */
        if (big) {
            SET_TYPE(f, i, T_BIG);
            return 0;
        }
        if (f->kind == K_INT) {
            f->nums[i] = iv;
            SET_TYPE(f, i, T_INT);
        } else {
            memcpy(&f->nums[i], &dv, sizeof dv);
            SET_TYPE(f, i, is_int ? T_INT : T_NUMBER);
        }
        return 0;
    }
    default: { /* raw */
        const unsigned char *start = s->p;
        int t = value_skip(s, 2);
        if (t < 0) return -1;
        size_t len = (size_t)(s->p - start);
        if (buf_reserve(&f->data, len)) goto fail;
        memcpy(f->data.data + f->data.len, start, len);
        f->data.len += len;
        SET_TYPE(f, i, t);
        return 0;
    }
    }
fail:
    s->fail = 1;
    return -1;
}

/* An object's key (s->p on its quote): its bytes, unescaped keys refused (a caller of msgspec would compare the
   decoded text). */
static int key(Scan *s, const unsigned char **k, Py_ssize_t *klen) {
    if (s->p >= s->end || *s->p != '"') {
        s->fail = 1;
        return -1;
    }
    const unsigned char *start = s->p + 1;
    int esc = 0;
    if (string(s, NULL, &esc)) return -1;
    if (esc) {
        s->fail = 1;
        return -1;
    }
    *k = start;
    *klen = (Py_ssize_t)(s->p - 1 - start);
    ws(s);
    if (s->p >= s->end || *s->p != ':') {
        s->fail = 1;
        return -1;
    }
    s->p++;
    return 0;
}

static int lookup(Scan *s, const int *idx, const int *at, const unsigned char *k, Py_ssize_t klen) {
    if (klen > MAX_KEY) return -1;
    for (int j = at[klen]; j < at[klen + 1]; j++) {
        Field *f = &s->fields[idx[j]];
        if (memcmp(f->key, k, (size_t)klen) == 0) return idx[j];
    }
    return -1;
}

/* idx (n field indexes) ordered by key length, at[len] the first of that length (keys longer than MAX_KEY left
   out: no key they could match is looked up). */
static void by_length(Field *fields, int *idx, int *n, int *at) {
    int out[MAX_FIELDS], m = 0;
    for (int len = 0; len <= MAX_KEY; len++) {
        at[len] = m;
        for (int j = 0; j < *n; j++)
            if (fields[idx[j]].klen == len) out[m++] = idx[j];
    }
    at[MAX_KEY + 1] = m;
    memcpy(idx, out, sizeof(int) * (size_t)m);
    *n = m;
}

static int args_object(Scan *s, Py_ssize_t i) {
    ws(s);
    if (s->p >= s->end || *s->p != '{') goto fail; /* args that is no object: msgspec's ValidationError */
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        ws(s);
        const unsigned char *k;
        Py_ssize_t klen;
        if (key(s, &k, &klen)) return -1;
        int j = lookup(s, s->arg, s->arg_at, k, klen);
        if (j >= 0) {
            if (field_value(s, &s->fields[j], i)) return -1;
        } else if (value_skip(s, 3) < 0) {
            return -1;
        }
        ws(s);
        if (s->p >= s->end) goto fail;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p == '}') {
            s->p++;
            return 0;
        }
        goto fail;
    }
fail:
    s->fail = 1;
    return -1;
}

static int event(Scan *s, Py_ssize_t i) {
    ws(s);
    if (s->p >= s->end || *s->p != '{') goto fail; /* an event that is no object */
    s->p++;
    ws(s);
    int had_args = 0;
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        ws(s);
        const unsigned char *k;
        Py_ssize_t klen;
        if (key(s, &k, &klen)) return -1;
        if (klen == 4 && memcmp(k, "args", 4) == 0) {
            if (had_args++) goto fail; /* args given twice */
            if (args_object(s, i)) return -1;
        } else {
            int j = lookup(s, s->top, s->top_at, k, klen);
            if (j >= 0) {
                if (field_value(s, &s->fields[j], i)) return -1;
            } else if (value_skip(s, 2) < 0) {
                return -1;
            }
        }
        ws(s);
        if (s->p >= s->end) goto fail;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p == '}') {
            s->p++;
            return 0;
        }
        goto fail;
    }
fail:
    s->fail = 1;
    return -1;
}

static int scan_array(Scan *s) {
    ws(s);
    if (s->p >= s->end || *s->p != '[') return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
    } else {
        for (;;) {
            if (s->n == s->cap && grow(s)) return -1;
            if (event(s, s->n)) return -1;
            for (int j = 0; j < s->nfields; j++) {
                Field *f = &s->fields[j];
                if (f->offs) f->offs[s->n + 1] = (int64_t)f->data.len;
            }
            s->n++;
            ws(s);
            if (s->p >= s->end) return -1;
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p == ']') {
                s->p++;
                break;
            }
            return -1;
        }
    }
    ws(s);
    return s->p == s->end ? 0 : -1;
}

static void free_fields(Field *fields, int n) {
    for (int i = 0; i < n; i++) {
        free(fields[i].types);
        free(fields[i].nums);
        free(fields[i].offs);
        free(fields[i].data.data);
    }
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *data_obj, *spec;
    if (!PyArg_ParseTuple(args, "OO", &data_obj, &spec)) return NULL;
    /* strtod reads the locale's decimal point: leave a run to msgspec under any other than '.' */
    const struct lconv *lc = localeconv();
    if (!lc || !lc->decimal_point || strcmp(lc->decimal_point, ".") != 0) Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(spec, "fields must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t nf = PySequence_Fast_GET_SIZE(seq);
    if (nf > MAX_FIELDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many fields");
        return NULL;
    }
    Field fields[MAX_FIELDS];
    memset(fields, 0, sizeof fields);
    Scan s;
    memset(&s, 0, sizeof s);
    s.fields = fields;
    s.nfields = (int)nf;
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        const char *k;
        Py_ssize_t klen;
        int kind, in_args;
        if (!PyArg_ParseTuple(item, "y#ip", &k, &klen, &kind, &in_args)) {
            Py_DECREF(seq);
            return NULL;
        }
        if (kind < K_TEXT || kind > K_STRICT_TEXT) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bad field kind");
            return NULL;
        }
        fields[i].key = k; /* borrowed from the spec, which outlives the scan */
        fields[i].klen = klen;
        fields[i].kind = kind;
        fields[i].in_args = in_args;
        fields[i].seen = -1;
        if (in_args) s.arg[s.narg++] = (int)i;
        else s.top[s.ntop++] = (int)i;
    }
    by_length(fields, s.top, &s.ntop, s.top_at);
    by_length(fields, s.arg, &s.narg, s.arg_at);
    Py_buffer view;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    s.p = (const unsigned char *)view.buf;
    s.end = s.p + view.len;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = scan_array(&s);
    if (rc == 0 && s.cap == 0) rc = grow(&s); /* columns of no events */
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&view);
    PyObject *out = NULL;
    if (rc != 0) {
        free_fields(fields, s.nfields);
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    PyObject *cols = PyList_New(nf);
    if (!cols) goto done;
    for (Py_ssize_t i = 0; i < nf; i++) {
        Field *f = &fields[i];
        PyObject *col;
        if (f->kind == K_INT || f->kind == K_FLOAT) {
            col = Py_BuildValue("(y#y#I)", (const char *)f->types, s.n, (const char *)f->nums, s.n * (Py_ssize_t)sizeof(int64_t),
                                f->kinds);
        } else {
            col = Py_BuildValue("(y#y#y#I)", (const char *)f->types, s.n, (const char *)f->offs,
                                (s.n + 1) * (Py_ssize_t)sizeof(int64_t), f->data.data ? f->data.data : "",
                                (Py_ssize_t)f->data.len, f->kinds);
        }
        if (!col) {
            Py_DECREF(cols);
            goto done;
        }
        PyList_SET_ITEM(cols, i, col);
    }
    out = Py_BuildValue("(nN)", s.n, cols);
done:
    free_fields(fields, s.nfields);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(data, fields) -> (n_events, columns) | None: a run of Kineto events as columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Kineto events as columns, natively.", -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
