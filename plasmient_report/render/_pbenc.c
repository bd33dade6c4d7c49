/* Protobuf messages in bulk, natively: the Perfetto writer's `Messages.encode` (render/perfetto.py) in C.

   encode(n, nodes) encodes n messages of one tree of message types. `nodes` lists the tree's message columns,
   children before their parents, the root last; each is a list of parts, one per field, in field order:
   (tag: bytes, kind: int, values, offsets, mask, take, child: int) with
     kind 0  const: `tag` holds the whole field (the same bytes in every row);
     kind 1  varint: `values` n uint64;
     kind 2  fixed64: `values` n 8-byte values;
     kind 3  bytes: `values` the blobs' bytes, `offsets` their int64 offsets (blob j is values[offsets[j]:
             offsets[j + 1]]), row i takes blob take[i] when `take` (n int64) is given, else blob i;
     kind 4  message: the column `nodes[child]` (its row i is this row's).
   `mask` (n bytes, 0 or 1) or None: rows without the field. Every column has n rows. Returns (data: bytes,
   offsets: bytes of n + 1 int64): row i's message is data[offsets[i]:offsets[i + 1]]. The same bytes as the
   numpy encoder (tests/test_perfetto.py compares them); the encoding runs without the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { K_CONST = 0, K_VARINT = 1, K_FIXED64 = 2, K_BYTES = 3, K_MESSAGE = 4 };

typedef struct {
    const uint8_t *tag;
    Py_ssize_t taglen;
    int kind;
    const uint64_t *vals;   /* varint, fixed64 */
    const uint8_t *data;    /* bytes */
    Py_ssize_t data_len;
    const int64_t *offs;    /* bytes: blob offsets */
    Py_ssize_t n_blobs;
    const uint8_t *mask;
    const int64_t *take;
    int child;
} Part;

typedef struct {
    Part *parts;
    int nparts;
    int64_t *sizes; /* per row */
} Node;

static inline int vsize(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *vput(uint8_t *o, uint64_t v) {
    while (v >= 0x80) {
        *o++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *o++ = (uint8_t)v;
    return o;
}

static inline int64_t blob_of(const Part *p, Py_ssize_t i) { return p->take ? p->take[i] : (int64_t)i; }

static int sizes(Node *nodes, int k, Py_ssize_t n) {
    Node *nd = &nodes[k];
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t total = 0;
        for (int j = 0; j < nd->nparts; j++) {
            const Part *p = &nd->parts[j];
            if (p->mask && !p->mask[i]) continue;
            total += p->taglen;
            switch (p->kind) {
            case K_VARINT: total += vsize(p->vals[i]); break;
            case K_FIXED64: total += 8; break;
            case K_BYTES: {
                int64_t b = blob_of(p, i);
                if (b < 0 || b >= p->n_blobs) return -1;
                int64_t len = p->offs[b + 1] - p->offs[b];
                if (len < 0 || p->offs[b] < 0 || p->offs[b + 1] > p->data_len) return -1;
                total += vsize((uint64_t)len) + len;
                break;
            }
            case K_MESSAGE: {
                int64_t len = nodes[p->child].sizes[i];
                total += vsize((uint64_t)len) + len;
                break;
            }
            default: break;
            }
        }
        nd->sizes[i] = total;
    }
    return 0;
}

static uint8_t *write_row(const Node *nodes, int k, Py_ssize_t i, uint8_t *o) {
    const Node *nd = &nodes[k];
    for (int j = 0; j < nd->nparts; j++) {
        const Part *p = &nd->parts[j];
        if (p->mask && !p->mask[i]) continue;
        memcpy(o, p->tag, (size_t)p->taglen);
        o += p->taglen;
        switch (p->kind) {
        case K_VARINT: o = vput(o, p->vals[i]); break;
        case K_FIXED64: memcpy(o, &p->vals[i], 8); o += 8; break;
        case K_BYTES: {
            int64_t b = blob_of(p, i);
            int64_t len = p->offs[b + 1] - p->offs[b];
            o = vput(o, (uint64_t)len);
            memcpy(o, p->data + p->offs[b], (size_t)len);
            o += len;
            break;
        }
        case K_MESSAGE:
            o = vput(o, (uint64_t)nodes[p->child].sizes[i]);
            o = write_row(nodes, p->child, i, o);
            break;
        default: break;
        }
    }
    return o;
}

typedef struct {
    Py_buffer views[5];
    int nviews;
} Held;

static int hold(Held *h, PyObject *obj, const void **ptr, Py_ssize_t *len) {
    if (obj == Py_None) {
        *ptr = NULL;
        if (len) *len = 0;
        return 0;
    }
    if (PyObject_GetBuffer(obj, &h->views[h->nviews], PyBUF_C_CONTIGUOUS) < 0) return -1;
    *ptr = h->views[h->nviews].buf;
    if (len) *len = h->views[h->nviews].len;
    h->nviews++;
    return 0;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n;
    PyObject *nodes_obj;
    if (!PyArg_ParseTuple(args, "nO", &n, &nodes_obj)) return NULL;
    PyObject *seq = PySequence_Fast(nodes_obj, "nodes must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t nn = PySequence_Fast_GET_SIZE(seq);
    Node *nodes = calloc((size_t)(nn ? nn : 1), sizeof(Node));
    Held *held = NULL;
    Py_ssize_t nheld = 0, cap_held = 0;
    PyObject *out = NULL;
    uint8_t *buf = NULL;
    int64_t *offsets = NULL;
    if (!nodes) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nn; k++) {
        PyObject *parts = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, k), "a node must be a sequence of parts");
        if (!parts) goto done;
        Py_ssize_t np_ = PySequence_Fast_GET_SIZE(parts);
        nodes[k].parts = calloc((size_t)(np_ ? np_ : 1), sizeof(Part));
        nodes[k].nparts = (int)np_;
        nodes[k].sizes = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        if (!nodes[k].parts || !nodes[k].sizes) {
            Py_DECREF(parts);
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t j = 0; j < np_; j++) {
            PyObject *tag, *vals, *offs, *mask, *take;
            int kind, child;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(parts, j), "OiOOOOi", &tag, &kind, &vals, &offs, &mask, &take,
                                  &child)) {
                Py_DECREF(parts);
                goto done;
            }
            if (nheld == cap_held) {
                cap_held = cap_held ? cap_held * 2 : 16;
                Held *h = realloc(held, sizeof(Held) * (size_t)cap_held);
                if (!h) {
                    Py_DECREF(parts);
                    PyErr_NoMemory();
                    goto done;
                }
                held = h;
            }
            Held *h = &held[nheld++];
            h->nviews = 0;
            Part *p = &nodes[k].parts[j];
            Py_ssize_t vlen = 0, olen = 0, mlen = 0, tlen = 0;
            p->kind = kind;
            p->child = child;
            if (hold(h, tag, (const void **)&p->tag, &p->taglen) || hold(h, vals, (const void **)&p->vals, &vlen) ||
                hold(h, offs, (const void **)&p->offs, &olen) || hold(h, mask, (const void **)&p->mask, &mlen) ||
                hold(h, take, (const void **)&p->take, &tlen)) {
                Py_DECREF(parts);
                goto done;
            }
            int bad = kind < K_CONST || kind > K_MESSAGE || (mask != Py_None && mlen != n) ||
                      (take != Py_None && tlen != n * 8) || ((kind == K_VARINT || kind == K_FIXED64) && vlen != n * 8) ||
                      (kind == K_MESSAGE && (child < 0 || child >= k)) || (kind == K_BYTES && olen < 8);
            if (kind == K_BYTES) {
                p->data = (const uint8_t *)p->vals;
                p->data_len = vlen;
                p->vals = NULL;
                p->n_blobs = olen / 8 - 1;
                if (take == Py_None && p->n_blobs < n) bad = 1;
            }
            if (bad) {
                Py_DECREF(parts);
                PyErr_SetString(PyExc_ValueError, "bad part");
                goto done;
            }
        }
        Py_DECREF(parts);
    }
    if (nn == 0) {
        PyErr_SetString(PyExc_ValueError, "no nodes");
        goto done;
    }
    int rc = 0;
    int64_t total = 0;
    offsets = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!offsets) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t k = 0; k < nn && rc == 0; k++) rc = sizes(nodes, (int)k, n);
    if (rc == 0) {
        offsets[0] = 0;
        for (Py_ssize_t i = 0; i < n; i++) offsets[i + 1] = offsets[i] + nodes[nn - 1].sizes[i];
        total = offsets[n];
        buf = malloc((size_t)(total ? total : 1));
        if (!buf) rc = -2;
        else {
            uint8_t *o = buf;
            for (Py_ssize_t i = 0; i < n; i++) o = write_row(nodes, (int)(nn - 1), i, o);
        }
    }
    Py_END_ALLOW_THREADS;
    if (rc == -1) {
        PyErr_SetString(PyExc_ValueError, "a blob out of range");
        goto done;
    }
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    out = Py_BuildValue("(y#y#)", (const char *)buf, (Py_ssize_t)total, (const char *)offsets,
                        (Py_ssize_t)(sizeof(int64_t) * (size_t)(n + 1)));
done:
    for (Py_ssize_t h = 0; h < nheld; h++)
        for (int v = 0; v < held[h].nviews; v++) PyBuffer_Release(&held[h].views[v]);
    free(held);
    if (nodes) {
        for (Py_ssize_t k = 0; k < nn; k++) {
            free(nodes[k].parts);
            free(nodes[k].sizes);
        }
        free(nodes);
    }
    free(buf);
    free(offsets);
    Py_DECREF(seq);
    return out;
}

/* records(template, ts, ts_at, uuid, tr_at, values, val_at) -> bytes: n records of one fixed layout (the Perfetto
   writer's counter packets of one track, `_counter_packets`), each a copy of `template` with a 9-byte varint of ts[i]
   at ts_at, one of the track's uuid (uuid[0]) at tr_at and the 8 bytes of values[i] at val_at. Every ts and the uuid
   are in [2**56, 2**63), whose varints (vput) are 9 bytes. The same bytes as the numpy path; written without the
   GIL. */
static int nine(uint64_t v) { return v >= ((uint64_t)1 << 56) && v < ((uint64_t)1 << 63); }

static PyObject *records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tmpl_o, *ts_o, *uu_o, *va_o;
    Py_ssize_t ts_at, tr_at, val_at;
    if (!PyArg_ParseTuple(args, "OOnOnOn", &tmpl_o, &ts_o, &ts_at, &uu_o, &tr_at, &va_o, &val_at)) return NULL;
    Held h = {.nviews = 0};
    const uint8_t *tmpl;
    const uint64_t *ts, *uu, *va;
    Py_ssize_t rlen, tlen, ulen, vlen;
    PyObject *out = NULL;
    if (hold(&h, tmpl_o, (const void **)&tmpl, &rlen) || hold(&h, ts_o, (const void **)&ts, &tlen) ||
        hold(&h, uu_o, (const void **)&uu, &ulen) || hold(&h, va_o, (const void **)&va, &vlen))
        goto done;
    Py_ssize_t n = tlen / 8;
    int bad = tmpl == NULL || ts == NULL || uu == NULL || va == NULL || tlen % 8 || ulen != 8 || vlen != tlen ||
              ts_at < 0 || ts_at + 9 > rlen || tr_at < 0 || tr_at + 9 > rlen || val_at < 0 || val_at + 8 > rlen ||
              !nine(uu[0]);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "bad records");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * rlen);
    if (!out) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n && !bad; i++, o += rlen) {
        if (!nine(ts[i])) {
            bad = 1;
            break;
        }
        memcpy(o, tmpl, (size_t)rlen);
        vput(o + ts_at, ts[i]);
        vput(o + tr_at, uu[0]);
        memcpy(o + val_at, &va[i], 8);
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, "a record's time out of range");
    }
done:
    for (int v = 0; v < h.nviews; v++) PyBuffer_Release(&h.views[v]);
    return out;
}

/* counters(ts, series, values, last, seqs) -> bytes: n counter samples as TracePackets on their series' own packet
   sequences (the Perfetto writer's `_series_packets`; the sequences' first packets, `Writer.counter_sequence`, set
   the track and an incremental clock as defaults): sample i of series k = series[i] is
     Trace.packet (1, LEN) { timestamp (8): ts[i] - last[k]; track_event (11, LEN) { type (9): COUNTER (4);
                                  counter_value (30, varint): values[i] when it is a whole number in [0, 2**53)
                                  (+0.0 included, -0.0 not), double_counter_value (44, fixed64): values[i] otherwise };
                                  trusted_packet_sequence_id (10): seqs[k] }
   and last[k] (uint64, one per series, written in place) becomes ts[i]. Times are uint64; a series going back in
   time (ts[i] < last[k]) or outside the series is refused (ValueError; `last` is then partly moved on). The same
   bytes as the numpy path (tests/test_perfetto.py); written without the GIL. */
static PyObject *counters(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ts_o, *se_o, *va_o, *last_o, *seq_o;
    if (!PyArg_ParseTuple(args, "OOOOO", &ts_o, &se_o, &va_o, &last_o, &seq_o)) return NULL;
    Held h = {.nviews = 0};
    const uint64_t *ts, *seq;
    const double *va;
    const int64_t *se;
    Py_ssize_t tlen, slen, vlen, qlen;
    Py_buffer lastv;
    int have_last = 0;
    PyObject *out = NULL;
    if (hold(&h, ts_o, (const void **)&ts, &tlen) || hold(&h, se_o, (const void **)&se, &slen) ||
        hold(&h, va_o, (const void **)&va, &vlen) || hold(&h, seq_o, (const void **)&seq, &qlen))
        goto done;
    if (PyObject_GetBuffer(last_o, &lastv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_last = 1;
    uint64_t *last = (uint64_t *)lastv.buf;
    Py_ssize_t n = tlen / 8, m = qlen / 8;
    if (ts == NULL || se == NULL || va == NULL || seq == NULL || tlen % 8 || qlen % 8 || slen != tlen || vlen != tlen ||
        lastv.len != qlen) {
        PyErr_SetString(PyExc_ValueError, "bad counter columns");
        goto done;
    }
    /* at most 2 + (1 + 10) + 14 + (1 + 10) bytes a packet */
    out = PyBytes_FromStringAndSize(NULL, n * 38);
    if (!out) goto done;
    uint8_t *start = (uint8_t *)PyBytes_AS_STRING(out), *o = start;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t k = se[i];
        if (k < 0 || k >= m || ts[i] < last[k]) {
            bad = 1;
            break;
        }
        uint64_t d = ts[i] - last[k];
        last[k] = ts[i];
        double x = va[i];
        /* (the range first: a NaN, or a double past uint64, must not reach the cast) */
        int whole = x >= 0.0 && x < 9007199254740992.0 && !signbit(x) && (double)(uint64_t)x == x;
        uint64_t u = whole ? (uint64_t)x : 0;
        int ev = 2 + 2 + (whole ? vsize(u) : 8);
        *o++ = 0x0A; /* Trace.packet: field 1, length-delimited */
        *o++ = (uint8_t)(1 + vsize(d) + 2 + ev + 1 + vsize(seq[k]));
        *o++ = 0x40; /* timestamp: field 8, varint */
        o = vput(o, d);
        *o++ = 0x5A; /* track_event: field 11, length-delimited */
        *o++ = (uint8_t)ev;
        *o++ = 0x48; /* type: field 9 = COUNTER (4) */
        *o++ = 4;
        if (whole) {
            *o++ = 0xF0; /* counter_value: field 30, varint (the tag's varint: 0xF0 0x01) */
            *o++ = 0x01;
            o = vput(o, u);
        } else {
            *o++ = 0xE1; /* double_counter_value: field 44, fixed64 (the tag's varint: 0xE1 0x02) */
            *o++ = 0x02;
            memcpy(o, &x, 8);
            o += 8;
        }
        *o++ = 0x50; /* trusted_packet_sequence_id: field 10, varint */
        o = vput(o, seq[k]);
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, "a sample's series out of range, or its series going back in time");
        goto done;
    }
    if (_PyBytes_Resize(&out, o - start) < 0) out = NULL;
done:
    if (have_last) PyBuffer_Release(&lastv);
    for (int v = 0; v < h.nviews; v++) PyBuffer_Release(&h.views[v]);
    return out;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS, "encode(n, nodes) -> (data, offsets): n protobuf messages of a tree of columns."},
    {"records", records, METH_VARARGS, "records(template, ts, ts_at, uuid, tr_at, values, val_at) -> bytes."},
    {"counters", counters, METH_VARARGS, "counters(ts, series, values, last, seqs) -> bytes: samples on their series' sequences."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pbenc", "Protobuf messages in bulk, natively.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__pbenc(void) { return PyModule_Create(&module); }
