/* A rowid table's columns read straight from the SQLite file's pages: the nsys export's tables (reader.Pages) without
   SQLite's virtual machine, which spends ~330 ns a row decoding records one value at a time (GPU_METRICS' 12.6 M
   rows: 4.2 s of one core through sqlite3_step, 4.9 s through the ADBC driver; ~0.5 s here).

   read(fd, page_size, usable, n_pages, root, cols, kinds, lo, hi)
     fd        an open descriptor of the database file (read with pread: never mapped, never written)
     page_size the header's page size; usable its page size less the reserved bytes per page
     n_pages   the pages the file holds (no page number above it is followed)
     root      the table's root page (sqlite_master.rootpage)
     cols      the record's column numbers to read (at most MAX_COLS, a module constant)
     kinds     one byte per column: 'i' an integer column, 'f' a number read as a double, 's' text (as CAST AS TEXT
               of text or a blob gives it), 'b' a blob (as the driver's typed read: a blob's or text's bytes, NULL
               for a number); the caller asks for 's' and 'b' only of a UTF-8 file
     lo, hi    the rowids to read, inclusive
   returns (n, buffers, masks, datas): n rows in rowid order; per column one buffer of n int64 (kind 'i') or float64
   (kind 'f'), or for 's' and 'b' Arrow's n + 1 int64 offsets into its bytes in datas (None for numbers); and per
   column None (no NULL) or n bytes, 0 where the value is NULL (a NULL, or a NaN, which SQLite reads as NULL).
   Payloads on overflow pages are gathered.

   None wherever SQLite's own reading could give anything else, so that the caller reads the range the way it
   always did: a value of another kind (text or a blob in a number column, a real in an integer column, an integer
   beyond 2^53 in a number column, a number in a text column), a broken overflow chain, a record with fewer columns,
   a page that is not a table b-tree page, any offset or size outside its page, keys or rowids out of order or
   outside the range their parents' keys give their page (SQLite's seek and this walk then agree on every page
   read), a tree deeper than SQLite's own limit or visiting more pages than the file holds (a cycle), a failed read.
   The caller holds a read transaction on the file meanwhile (no writer can change it) and uses this only on a file
   in rollback-journal mode with no journal beside it (so the file is the database as SQLite sees it).

   The file format: https://www.sqlite.org/fileformat2.html (b-tree pages §1.6, record format §2.1). The work runs
   without the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_COLS 64
#define MAX_DEPTH 20      /* SQLite's BTCURSOR_MAX_DEPTH */
#define BLOCK_PAGES 256   /* pages read at once: a table's leaves mostly follow one another in the file */
#define EXACT_DOUBLE (((int64_t)1) << 53)

enum { OK = 0, DEFER = 1, FAIL = 2, ISNULL = 3 };

typedef struct {
    int fd;
    uint32_t page_size, usable;
    uint64_t n_pages;
    uint8_t *block;
    uint64_t block_first, block_n;
    uint8_t *inner[MAX_DEPTH];
    uint64_t visited;
    int ncols;
    int cols[MAX_COLS];
    char kinds[MAX_COLS];
    int maxcol;
    int16_t *first;           /* record column -> the first of the requested columns it is, or -1 */
    int next[MAX_COLS];       /* -> the next requested column that is the same record column, or -1 */
    int64_t lo, hi;
    int have_last, done;
    int64_t last;
    int64_t n, cap;
    int64_t *out[MAX_COLS];   /* values; for text and blobs each row's end offset in data */
    uint8_t *valid[MAX_COLS]; /* one byte a row (1: a value), from a column's first NULL on */
    uint8_t *data[MAX_COLS];  /* text and blob columns: their bytes one after the other */
    int64_t dlen[MAX_COLS], dcap[MAX_COLS];
    uint8_t *payload, *ovpage; /* a payload gathered from its overflow pages; one overflow page */
    uint64_t payload_cap;
} Reader;

/* A varint at p (SQLite's: big-endian 7-bit groups, the ninth byte whole), not past end; 0 if it would be. */
static inline int getvarint(const uint8_t *p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) {
        if (p + i >= end)
            return 0;
        x = (x << 7) | (p[i] & 0x7f);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    if (p + 8 >= end)
        return 0;
    *v = (x << 8) | p[8];
    return 9;
}

static inline uint32_t be16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Page `pg` (1-based), through a block of pages read at once; valid until the next call. */
static const uint8_t *page(Reader *r, uint64_t pg) {
    if (pg < 1 || pg > r->n_pages)
        return NULL;
    if (r->block_n && pg >= r->block_first && pg < r->block_first + r->block_n)
        return r->block + (pg - r->block_first) * r->page_size;
    uint64_t n = r->n_pages - pg + 1;
    if (n > BLOCK_PAGES)
        n = BLOCK_PAGES;
    size_t want = (size_t)n * r->page_size, got = 0;
    off_t at = (off_t)((pg - 1) * (uint64_t)r->page_size);
    while (got < want) {
        ssize_t k = pread(r->fd, r->block + got, want - got, at + (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    r->block_n = got / r->page_size;
    r->block_first = pg;
    if (r->block_n == 0)
        return NULL;
    return r->block;
}

/* Page `pg` into `buf` (an overflow page: read apart, so the block holding the leaf stays). */
static int read_page(Reader *r, uint64_t pg, uint8_t *buf) {
    if (pg < 1 || pg > r->n_pages)
        return DEFER;
    size_t got = 0;
    off_t at = (off_t)((pg - 1) * (uint64_t)r->page_size);
    while (got < r->page_size) {
        ssize_t k = pread(r->fd, buf + got, r->page_size - got, at + (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return DEFER;
        got += (size_t)k;
    }
    return OK;
}

static int append_bytes(Reader *r, int j, const uint8_t *p, int64_t len) {
    if (len == 0)
        return OK;
    if (r->dlen[j] + len > r->dcap[j]) {
        int64_t cap = r->dcap[j] ? r->dcap[j] : 1 << 16;
        while (cap < r->dlen[j] + len)
            cap *= 2;
        uint8_t *d = realloc(r->data[j], (size_t)cap);
        if (!d)
            return FAIL;
        r->data[j] = d;
        r->dcap[j] = cap;
    }
    memcpy(r->data[j] + r->dlen[j], p, (size_t)len);
    r->dlen[j] += len;
    return OK;
}

static int grow(Reader *r) {
    int64_t cap = r->cap ? r->cap * 2 : 65536;
    for (int j = 0; j < r->ncols; j++) {
        int64_t *p = realloc(r->out[j], (size_t)cap * sizeof(int64_t));
        if (!p)
            return FAIL;
        r->out[j] = p;
        if (r->valid[j]) {
            uint8_t *v = realloc(r->valid[j], (size_t)cap);
            if (!v)
                return FAIL;
            r->valid[j] = v;
        }
    }
    r->cap = cap;
    return OK;
}

/* One value of serial type `st` at p (its `len` bytes checked by the caller) as column j's kind, into *dst (for text
   and blobs the column's end offset); ISNULL for a NULL (*dst 0, or the offset unchanged). */
static inline int value(Reader *r, int j, uint64_t st, const uint8_t *p, int64_t len, int64_t *dst) {
    int64_t v;
    if (r->kinds[j] == 's' || r->kinds[j] == 'b') {
        *dst = r->dlen[j];
        if (st == 0)
            return ISNULL;
        if (st >= 12) {  /* text or a blob: its bytes (CAST AS TEXT / AS BLOB keep them; the file is UTF-8) */
            int s = append_bytes(r, j, p, len);
            *dst = r->dlen[j];
            return s;
        }
        /* a number: CAST AS TEXT formats it SQLite's way (left to SQLite); the blob read's CASE gives NULL */
        return r->kinds[j] == 'b' ? ISNULL : DEFER;
    }
    switch (st) {
    case 1: v = (int8_t)p[0]; break;
    case 2: v = (int16_t)be16(p); break;
    case 3: v = (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8)) >> 8; break;
    case 4: v = (int32_t)be32(p); break;
    case 5: v = (int64_t)(((uint64_t)(int64_t)(int16_t)be16(p) << 32) | be32(p + 2)); break;
    case 6: v = (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4)); break;
    case 8: v = 0; break;
    case 9: v = 1; break;
    case 7: {
        if (r->kinds[j] != 'f')
            return DEFER;  /* a real in an integer column: SQLite's CAST, not ours */
        uint64_t bits = ((uint64_t)be32(p) << 32) | be32(p + 4);
        double d;
        memcpy(&d, &bits, 8);
        if (isnan(d)) {
            *dst = 0;
            return ISNULL;  /* as SQLite reads it */
        }
        memcpy(dst, &d, 8);
        return OK;
    }
    case 0: *dst = 0; return ISNULL;
    default: return DEFER;  /* text, a blob, the reserved 10 and 11 */
    }
    if (r->kinds[j] == 'f') {
        if (v > EXACT_DOUBLE || v < -EXACT_DOUBLE)
            return DEFER;
        double d = (double)v;
        memcpy(dst, &d, 8);
    } else {
        *dst = v;
    }
    return OK;
}

static inline int64_t serial_len(uint64_t st) {
    static const int8_t fixed[10] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0};
    if (st < 10)
        return fixed[st];
    if (st < 12)
        return -1;
    return (int64_t)((st - 12) / 2);
}

/* The rowids a page may hold: above `lower` (when `has_lower`) and at most `upper`, as its parents' keys say. */
typedef struct {
    int has_lower;
    int64_t lower, upper;
} Bounds;

static inline int within(const Bounds *b, int64_t key) { return (!b->has_lower || key > b->lower) && key <= b->upper; }

static int leaf(Reader *r, const uint8_t *pg, uint32_t hdr, const Bounds *b) {
    const uint8_t *end = pg + r->usable;
    uint32_t ncells = be16(pg + hdr + 3);
    if (hdr + 8 + 2 * (uint64_t)ncells > r->usable)
        return DEFER;
    uint64_t max_local = r->usable - 35;
    for (uint32_t i = 0; i < ncells; i++) {
        uint32_t off = be16(pg + hdr + 8 + 2 * i);
        if (off >= r->usable)
            return DEFER;
        const uint8_t *p = pg + off;
        uint64_t size, rowid_u;
        int k = getvarint(p, end, &size);
        if (!k)
            return DEFER;
        p += k;
        k = getvarint(p, end, &rowid_u);
        if (!k)
            return DEFER;
        p += k;
        int64_t rowid = (int64_t)rowid_u;
        /* The payload's bytes on this page (fileformat2.html §1.6: all of it up to U - 35 bytes, else M + (P - M) %
           (U - 4) when that fits, else M), the rest on a chain of overflow pages after a 4-byte page number. */
        uint64_t local = size;
        if (size > max_local) {
            uint64_t m = ((uint64_t)(r->usable - 12) * 32 / 255) - 23;
            uint64_t kk = m + (size - m) % (r->usable - 4);
            local = kk <= max_local ? kk : m;
            if ((uint64_t)(end - p) < local + 4 || size > r->n_pages * (uint64_t)r->usable)
                return DEFER;
        } else if ((uint64_t)(end - p) < size) {
            return DEFER;  /* runs past the page */
        }
        if ((r->have_last && rowid <= r->last) || !within(b, rowid))
            return DEFER;  /* rowids out of order, or outside what the parents' keys give this page */
        r->have_last = 1;
        r->last = rowid;
        if (rowid < r->lo)
            continue;
        if (rowid > r->hi) {
            r->done = 1;  /* past hi: nothing further is read, but this page's order still checked (as below) */
            continue;
        }
        if (local < size) {  /* gather the payload */
            if (size > r->payload_cap) {
                uint8_t *q = realloc(r->payload, (size_t)size);
                if (!q)
                    return FAIL;
                r->payload = q;
                r->payload_cap = size;
            }
            memcpy(r->payload, p, (size_t)local);
            uint64_t have = local, next = be32(p + local);
            while (have < size) {
                if (read_page(r, next, r->ovpage) != OK)
                    return DEFER;
                uint64_t take = size - have < r->usable - 4 ? size - have : r->usable - 4;
                memcpy(r->payload + have, r->ovpage + 4, (size_t)take);
                have += take;
                next = be32(r->ovpage);
            }
            p = r->payload;
        }
        const uint8_t *rec = p, *rend = p + size;
        uint64_t hsize;
        k = getvarint(rec, rend, &hsize);
        if (!k || hsize > size || hsize < (uint64_t)k)
            return DEFER;
        const uint8_t *h = rec + k, *hend = rec + hsize;
        uint64_t body = hsize;
        if (r->n == r->cap && grow(r) != OK)
            return FAIL;
        int col = 0, found = 0;
        while (h < hend && col <= r->maxcol) {
            uint64_t st;
            k = getvarint(h, hend, &st);
            if (!k)
                return DEFER;
            h += k;
            int64_t len = serial_len(st);
            if (len < 0 || body + (uint64_t)len > size)
                return DEFER;
            for (int j = r->first[col]; j >= 0; j = r->next[j]) {
                int s = value(r, j, st, rec + body, len, &r->out[j][r->n]);
                if (s == FAIL)
                    return FAIL;
                if (s == ISNULL) {
                    if (!r->valid[j]) {
                        r->valid[j] = malloc((size_t)r->cap);
                        if (!r->valid[j])
                            return FAIL;
                        memset(r->valid[j], 1, (size_t)r->n);
                    }
                    r->valid[j][r->n] = 0;
                } else if (s != OK) {
                    return DEFER;
                } else if (r->valid[j]) {
                    r->valid[j][r->n] = 1;
                }
                found++;
            }
            body += (uint64_t)len;
            col++;
        }
        if (found != r->ncols)
            return DEFER;  /* a record with fewer columns (a column added later): its default is SQLite's */
        r->n++;
    }
    return OK;
}

static int walk(Reader *r, uint64_t pgno, int depth, const Bounds *b) {
    if (depth >= MAX_DEPTH || ++r->visited > r->n_pages)
        return DEFER;
    const uint8_t *pg = page(r, pgno);
    if (!pg)
        return DEFER;
    uint32_t hdr = pgno == 1 ? 100 : 0;
    if (pg[hdr] == 13)
        return leaf(r, pg, hdr, b);
    if (pg[hdr] != 5)
        return DEFER;  /* an index b-tree (WITHOUT ROWID) or not a b-tree page */
    memcpy(r->inner[depth], pg, r->page_size);  /* the block moves on below */
    pg = r->inner[depth];
    const uint8_t *end = pg + r->usable;
    uint32_t ncells = be16(pg + hdr + 3);
    if (hdr + 12 + 2 * (uint64_t)ncells > r->usable)
        return DEFER;
    /* Every key first: in order and within the page's own bounds (SQLite's binary search over them then picks the
       children this walk does). */
    Bounds keys = *b;
    for (uint32_t i = 0; i < ncells; i++) {
        uint32_t off = be16(pg + hdr + 12 + 2 * i);
        uint64_t key_u;
        if (off + 4 > r->usable || !getvarint(pg + off + 4, end, &key_u) || !within(&keys, (int64_t)key_u))
            return DEFER;
        keys.has_lower = 1;
        keys.lower = (int64_t)key_u;
    }
    Bounds child = *b;  /* child i holds the rowids above key i - 1 (the page's lower bound for the first), up to key i */
    for (uint32_t i = 0; i < ncells; i++) {
        uint32_t off = be16(pg + hdr + 12 + 2 * i);
        uint64_t key_u = 0;
        getvarint(pg + off + 4, end, &key_u);  /* (checked above) */
        int64_t key = (int64_t)key_u;
        if (child.has_lower && child.lower >= r->hi)
            return OK;  /* this child's rowids are above hi */
        child.upper = key;
        if (key >= r->lo) {
            int s = walk(r, be32(pg + off), depth + 1, &child);
            if (s != OK || r->done)
                return s;
        }
        child.has_lower = 1;
        child.lower = key;
    }
    if (child.has_lower && child.lower >= r->hi)
        return OK;
    child.upper = b->upper;
    return walk(r, be32(pg + hdr + 8), depth + 1, &child);
}

static PyObject *read_table(PyObject *self, PyObject *args) {
    int fd;
    unsigned int page_size, usable;
    unsigned long long n_pages, root;
    PyObject *cols;
    const char *kinds;
    Py_ssize_t nkinds;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "iIIKKOy#LL", &fd, &page_size, &usable, &n_pages, &root, &cols, &kinds, &nkinds, &lo, &hi))
        return NULL;
    if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1)) || usable < 480 || usable > page_size) {
        PyErr_SetString(PyExc_ValueError, "bad page size");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(cols, "cols must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    if (ncols < 1 || ncols > MAX_COLS || ncols != nkinds) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "one kind per column, 1 to MAX_COLS columns");
        return NULL;
    }
    Reader r;
    memset(&r, 0, sizeof r);
    r.fd = fd;
    r.page_size = page_size;
    r.usable = usable;
    r.n_pages = n_pages;
    r.ncols = (int)ncols;
    r.lo = lo;
    r.hi = hi;
    r.maxcol = -1;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        long c = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if ((c == -1 && PyErr_Occurred()) || c < 0 || c > 32767 || !strchr("ifsb", kinds[j]) || !kinds[j]) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "bad column or kind");
            return NULL;
        }
        r.cols[j] = (int)c;
        r.kinds[j] = kinds[j];
        if (c > r.maxcol)
            r.maxcol = (int)c;
    }
    Py_DECREF(seq);
    r.first = malloc(((size_t)r.maxcol + 1) * sizeof(int16_t));
    if (!r.first)
        return PyErr_NoMemory();
    memset(r.first, 0xff, ((size_t)r.maxcol + 1) * sizeof(int16_t));  /* -1 */
    for (int j = r.ncols - 1; j >= 0; j--) {
        r.next[j] = r.first[r.cols[j]];
        r.first[r.cols[j]] = (int16_t)j;
    }
    int status = OK;
    Py_BEGIN_ALLOW_THREADS
    r.block = malloc((size_t)BLOCK_PAGES * page_size);
    r.ovpage = malloc(page_size);
    if (!r.ovpage)
        status = FAIL;
    for (int d = 0; d < MAX_DEPTH && r.block; d++) {
        r.inner[d] = malloc(page_size);
        if (!r.inner[d])
            status = FAIL;
    }
    if (!r.block || status != OK || grow(&r) != OK)
        status = FAIL;
    else if (lo <= hi) {
        Bounds all = {0, 0, INT64_MAX};
        status = walk(&r, root, 0, &all);
    }
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (status == FAIL) {
        PyErr_NoMemory();
    } else if (status == DEFER) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *bufs = PyList_New(ncols), *masks = PyList_New(ncols), *datas = PyList_New(ncols);
        for (int j = 0; bufs && masks && datas && j < r.ncols; j++) {
            int text = r.kinds[j] == 's' || r.kinds[j] == 'b';
            PyObject *b, *m, *d;
            if (text) {  /* Arrow's offsets: n + 1, from 0 */
                b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((r.n + 1) * 8));
                if (b) {
                    int64_t zero = 0;
                    memcpy(PyBytes_AS_STRING(b), &zero, 8);
                    if (r.n)
                        memcpy(PyBytes_AS_STRING(b) + 8, r.out[j], (size_t)r.n * 8);
                }
                d = PyBytes_FromStringAndSize((const char *)(r.data[j] ? r.data[j] : (uint8_t *)""), (Py_ssize_t)r.dlen[j]);
            } else {
                b = PyBytes_FromStringAndSize((const char *)r.out[j], (Py_ssize_t)(r.n * 8));
                d = Py_NewRef(Py_None);
            }
            m = r.valid[j] ? PyBytes_FromStringAndSize((const char *)r.valid[j], (Py_ssize_t)r.n) : Py_NewRef(Py_None);
            if (b)
                PyList_SET_ITEM(bufs, j, b);
            if (m)
                PyList_SET_ITEM(masks, j, m);
            if (d)
                PyList_SET_ITEM(datas, j, d);
            if (!b || !m || !d)
                Py_CLEAR(bufs);
        }
        if (bufs && masks && datas)
            result = Py_BuildValue("(LNNN)", (long long)r.n, bufs, masks, datas);
        else {
            Py_XDECREF(bufs);
            Py_XDECREF(masks);
            Py_XDECREF(datas);
        }
    }
    free(r.first);
    free(r.block);
    free(r.ovpage);
    free(r.payload);
    for (int d = 0; d < MAX_DEPTH; d++)
        free(r.inner[d]);
    for (int j = 0; j < MAX_COLS; j++) {
        free(r.out[j]);
        free(r.valid[j]);
        free(r.data[j]);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_table, METH_VARARGS, "A rowid table's number columns from the file's pages, or None (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sqlpages", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sqlpages(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_COLS", MAX_COLS) < 0)
        Py_CLEAR(m);
    return m;
}
