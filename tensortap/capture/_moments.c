/* One pass over each of a step's tensors for the statistics saved without the raw value (docs/pytorch.md,
 * "Statistics on the device"): min, max, Σx, Σx², Σ|x| and the count of NaN/±inf elements.
 *
 * moments(kind, [(address, element count), ...], out) reads contiguous tensors of one element type (kind 0
 * float32, 1 float64, 2 bfloat16) and writes 8 float64 values per tensor into the writable buffer `out`
 * (8 × n doubles): min, max, Σx, Σx², Σ|x|, non-finite count, mean (Σx / count) and the L2 norm (√Σx²).
 *
 * Definitions (what tests/capture/test_moments.py checks against a float64 reference):
 * - min and max are exact (a value of the tensor), NaN when the tensor holds a NaN; they are undefined (±inf as
 *   written here) for zero elements, where the caller saves none.
 * - Σx, Σx², Σ|x| accumulate in float64 (float32 and bfloat16 elements are exact in float64; so are their
 *   squares), 8 partial sums over blocks of 1,024 elements added into the total block by block: the error is at
 *   most about (128 + n/1024)·2⁻⁵³·Σ|x| (Σx² likewise, of the squares), far under a float32 rounding.
 * - The non-finite count is exact. It is counted in a second pass, only over a tensor whose Σx² is not finite
 *   (float32/bfloat16: exactly when an element is NaN or ±inf; float64: also when Σx² overflows).
 *
 * squares(kind, [(address, element count), ...], out) is the L2 norm's pass alone (the flight recorder's statistics,
 * docs/pytorch.md "The flight recorder"): 2 float64 values per tensor, Σx² and the non-finite count, with the same
 * definitions (16 partial sums over blocks of 1,024: within the same bound), about twice as fast as `moments`; it
 * returns the number of tensors whose Σx² is not finite.
 * The caller guarantees the addresses are valid for that many elements. The GIL is released from 1 MiB.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 8
#define BLOCK 1024
#define RELEASE_GIL_BYTES (1 << 20)
#define OUT_FIELDS 10

static inline double bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef double v8d __attribute__((vector_size(64)));
typedef int64_t v8l __attribute__((vector_size(64)));

#define INLINE static inline __attribute__((always_inline))

/* Eight elements at p (any alignment): as the type min and max are taken in (float for float32 and bfloat16,
 * double for float64), and as doubles in two halves u, w for the sums. */
INLINE void load8_f32(const char *p, v8f *x, v4d *u, v4d *w)
{
    v4f a, b;
    memcpy(x, p, sizeof *x);
    memcpy(&a, p, sizeof a);
    memcpy(&b, p + sizeof a, sizeof b);
    *u = __builtin_convertvector(a, v4d);
    *w = __builtin_convertvector(b, v4d);
}
INLINE void load8_bf16(const char *p, v8f *x, v4d *u, v4d *w)
{
    v8h h;
    v4f a, b;
    memcpy(&h, p, sizeof h);
    v8i bits = __builtin_convertvector(h, v8i) << 16;
    memcpy(x, &bits, sizeof *x);
    memcpy(&a, &bits, sizeof a);
    memcpy(&b, (const char *)&bits + sizeof a, sizeof b);
    *u = __builtin_convertvector(a, v4d);
    *w = __builtin_convertvector(b, v4d);
}
INLINE void load8_f64(const char *p, v8d *x, v4d *u, v4d *w)
{
    memcpy(x, p, sizeof *x);
    memcpy(u, p, sizeof *u);
    memcpy(w, p + sizeof *u, sizeof *w);
}
INLINE double load1_f32(const char *p, int64_t k) { return (double)((const float *)p)[k]; }
INLINE double load1_f64(const char *p, int64_t k) { return ((const double *)p)[k]; }
INLINE double load1_bf16(const char *p, int64_t k) { return bf16_value(((const uint16_t *)p)[k]); }

#define VMIN(V, M, a, b) ((V)(((M)(a) & (M)((a) < (b))) | ((M)(b) & ~(M)((a) < (b)))))
#define VMAX(V, M, a, b) ((V)(((M)(a) & (M)((a) > (b))) | ((M)(b) & ~(M)((a) > (b)))))

INLINE v4d vabs(v4d a)
{
    const v4l mask = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    return (v4d)((v4l)a & mask);
}

/* The pass over one tensor of element size S; V/M: the vector and mask types of 8 elements min and max are taken
 * in; LOAD8/LOAD1 read 8 / 1 elements; ABS: whether Σ|x| is wanted. Two sets of 4-lane float64 sums (8 partial
 * sums), added into the totals every BLOCK elements. */
#define MOMENTS_BODY(S, V, M, LOAD8, LOAD1, ABS)                                                       \
    const char *p = (const char *)x;                                                                   \
    V mn, mx;                                                                                          \
    for (int j = 0; j < 8; j++) {                                                                      \
        mn[j] = INFINITY;                                                                              \
        mx[j] = -INFINITY;                                                                             \
    }                                                                                                  \
    double ts = 0.0, ts2 = 0.0, tsa = 0.0, lo = INFINITY, hi = -INFINITY;                              \
    int64_t i = 0;                                                                                     \
    while (i < n) {                                                                                    \
        int64_t end = n - i > BLOCK ? i + BLOCK : n;                                                   \
        v4d s0 = {0}, s1 = {0}, q0 = {0}, q1 = {0}, a0 = {0}, a1 = {0};                                \
        for (; i + 8 <= end; i += 8) {                                                                 \
            V v;                                                                                       \
            v4d u, w;                                                                                  \
            LOAD8(p + (S) * i, &v, &u, &w);                                                            \
            mn = VMIN(V, M, v, mn);                                                                    \
            mx = VMAX(V, M, v, mx);                                                                    \
            s0 += u;                                                                                   \
            s1 += w;                                                                                   \
            q0 += u * u;                                                                               \
            q1 += w * w;                                                                               \
            if (ABS) {                                                                                 \
                a0 += vabs(u);                                                                         \
                a1 += vabs(w);                                                                         \
            }                                                                                          \
        }                                                                                              \
        double bs = 0.0, bs2 = 0.0, bsa = 0.0;                                                         \
        for (; i < end; i++) {                                                                         \
            double v = LOAD1(p, i);                                                                    \
            lo = v < lo ? v : lo;                                                                      \
            hi = v > hi ? v : hi;                                                                      \
            bs += v;                                                                                   \
            bs2 += v * v;                                                                              \
            bsa += fabs(v);                                                                            \
        }                                                                                              \
        for (int j = 0; j < 4; j++) {                                                                  \
            bs += s0[j] + s1[j];                                                                       \
            bs2 += q0[j] + q1[j];                                                                      \
            bsa += a0[j] + a1[j];                                                                      \
        }                                                                                              \
        ts += bs;                                                                                      \
        ts2 += bs2;                                                                                    \
        tsa += bsa;                                                                                    \
    }                                                                                                  \
    for (int j = 0; j < 8; j++) {                                                                      \
        lo = mn[j] < lo ? (double)mn[j] : lo;                                                          \
        hi = mx[j] > hi ? (double)mx[j] : hi;                                                          \
    }                                                                                                  \
    double nonfinite = 0.0;                                                                            \
    if (!isfinite(ts2)) { /* a NaN or ±inf, or (float64) Σx² overflowed: count, and look for NaN */    \
        int64_t bad = 0, nan = 0;                                                                      \
        for (int64_t k = 0; k < n; k++) {                                                              \
            double v = LOAD1(p, k);                                                                    \
            bad += !isfinite(v);                                                                       \
            nan += isnan(v);                                                                           \
        }                                                                                              \
        nonfinite = (double)bad;                                                                       \
        if (nan)                                                                                       \
            lo = hi = NAN;                                                                             \
    }                                                                                                  \
    out[0] = lo;                                                                                       \
    out[1] = hi;                                                                                       \
    out[2] = ts;                                                                                       \
    out[3] = ts2;                                                                                      \
    out[4] = (ABS) ? tsa : NAN;                                                                        \
    out[5] = nonfinite;                                                                                \
    out[6] = n ? ts / (double)n : NAN;                                                                 \
    out[7] = sqrt(ts2);                                                                                \
    out[8] = lo != lo ? lo : (-lo > hi ? -lo : hi);                                                    \
    out[9] = (ABS) && n ? tsa / (double)n : NAN;

/* built for the running CPU's widest vectors (x86-64 with GCC's function multiversioning), else the default */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

#define MOMENTS_FN(NAME, S, V, M, LOAD8, LOAD1, ABS)                                                   \
    VECTOR_CLONES static void NAME(const void *x, int64_t n, double *out)                             \
    {                                                                                                  \
        MOMENTS_BODY(S, V, M, LOAD8, LOAD1, ABS)                                                       \
    }

MOMENTS_FN(moments_f32, 4, v8f, v8i, load8_f32, load1_f32, 0)
MOMENTS_FN(moments_f64, 8, v8d, v8l, load8_f64, load1_f64, 0)
MOMENTS_FN(moments_bf16, 2, v8f, v8i, load8_bf16, load1_bf16, 0)
MOMENTS_FN(moments_abs_f32, 4, v8f, v8i, load8_f32, load1_f32, 1)
MOMENTS_FN(moments_abs_f64, 8, v8d, v8l, load8_f64, load1_f64, 1)
MOMENTS_FN(moments_abs_bf16, 2, v8f, v8i, load8_bf16, load1_bf16, 1)

/* Σx² alone: 16 elements a turn, widened to float64 eight at a time (one 8-lane conversion: GCC 12 turns a 4-lane
 * one into two 2-lane ones), in two 8-lane float64 sums (16 partial sums), added into the total every BLOCK elements;
 * the non-finite count as in MOMENTS_BODY (a second pass, only where Σx² is not finite). */
INLINE v8d wide8_f32(const char *p)
{
    v8f x;
    memcpy(&x, p, sizeof x);
    return __builtin_convertvector(x, v8d);
}
INLINE v8d wide8_bf16(const char *p)
{
    v8h h;
    memcpy(&h, p, sizeof h);
    v8i bits = __builtin_convertvector(h, v8i) << 16;
    v8f x;
    memcpy(&x, &bits, sizeof x);
    return __builtin_convertvector(x, v8d);
}
INLINE v8d wide8_f64(const char *p)
{
    v8d x;
    memcpy(&x, p, sizeof x);
    return x;
}

#define SQUARES_FN(NAME, S, WIDE8, LOAD1)                                                              \
    VECTOR_CLONES static void NAME(const void *x, int64_t n, double *out)                             \
    {                                                                                                  \
        const char *p = (const char *)x;                                                               \
        double ts2 = 0.0;                                                                              \
        int64_t i = 0;                                                                                 \
        while (i < n) {                                                                                \
            int64_t end = n - i > BLOCK ? i + BLOCK : n;                                               \
            v4d q0 = {0}, q1 = {0}, q2 = {0}, q3 = {0};                                                \
            for (; i + 16 <= end; i += 16) {                                                           \
                v8d u = WIDE8(p + (S) * i), w = WIDE8(p + (S) * (i + 8));                              \
                v4d u0 = __builtin_shufflevector(u, u, 0, 1, 2, 3);                                    \
                v4d u1 = __builtin_shufflevector(u, u, 4, 5, 6, 7);                                    \
                v4d w0 = __builtin_shufflevector(w, w, 0, 1, 2, 3);                                    \
                v4d w1 = __builtin_shufflevector(w, w, 4, 5, 6, 7);                                    \
                q0 += u0 * u0;                                                                         \
                q1 += u1 * u1;                                                                         \
                q2 += w0 * w0;                                                                         \
                q3 += w1 * w1;                                                                         \
            }                                                                                          \
            double bs2 = 0.0;                                                                          \
            for (; i < end; i++) {                                                                     \
                double v = LOAD1(p, i);                                                                \
                bs2 += v * v;                                                                          \
            }                                                                                          \
            for (int j = 0; j < 4; j++)                                                                \
                bs2 += (q0[j] + q1[j]) + (q2[j] + q3[j]);                                              \
            ts2 += bs2;                                                                                \
        }                                                                                              \
        double nonfinite = 0.0;                                                                        \
        if (!isfinite(ts2)) {                                                                          \
            int64_t bad = 0;                                                                           \
            for (int64_t k = 0; k < n; k++)                                                            \
                bad += !isfinite(LOAD1(p, k));                                                         \
            nonfinite = (double)bad;                                                                   \
        }                                                                                              \
        out[0] = ts2;                                                                                  \
        out[1] = nonfinite;                                                                            \
    }

SQUARES_FN(squares_f32, 4, wide8_f32, load1_f32)
SQUARES_FN(squares_f64, 8, wide8_f64, load1_f64)
SQUARES_FN(squares_bf16, 2, wide8_bf16, load1_bf16)

typedef void (*moments_fn)(const void *, int64_t, double *);
static const moments_fn KINDS[2][3] = {{moments_f32, moments_f64, moments_bf16},
                                       {moments_abs_f32, moments_abs_f64, moments_abs_bf16}};
static const moments_fn SQUARES[2][3] = {{squares_f32, squares_f64, squares_bf16},
                                          {squares_f32, squares_f64, squares_bf16}};
static const int ITEM_SIZE[] = {4, 8, 2};

/* moments(...) and squares(...): `fields` values per tensor from the functions `fns[with Σ|x|][kind]`; None, or
 * (squares) the number of tensors whose first value (Σx²) is not finite */
static PyObject *run(PyObject *args, const char *format, const char *name, int fields, const moments_fn fns[2][3])
{
    int kind, want_abs = 1;
    PyObject *sources;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, format, &kind, &sources, &out, &want_abs))
        return NULL;
    if (kind < 0 || kind > 2) {
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "%s: kind %d is not 0 (float32), 1 (float64) or 2 (bfloat16)", name, kind);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(sources, "sources must be a sequence of (address, element count)");
    if (seq == NULL) {
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (out.len < (Py_ssize_t)sizeof(double) * fields * n) {
        Py_DECREF(seq);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "%s: out holds %zd bytes, %zd tensors need %zd", name, out.len, n,
                     (Py_ssize_t)sizeof(double) * fields * n);
        return NULL;
    }
    uint64_t *addr = PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(n > 0 ? n : 1));
    if (addr == NULL) {
        Py_DECREF(seq);
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long a, k;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK:sources", &a, &k)) {
            PyMem_Free(addr);
            Py_DECREF(seq);
            PyBuffer_Release(&out);
            return NULL;
        }
        addr[2 * i] = a;
        addr[2 * i + 1] = k;
        total += k * (uint64_t)ITEM_SIZE[kind];
    }
    Py_DECREF(seq);
    moments_fn fn = fns[want_abs != 0][kind];
    double *o = (double *)out.buf;
    if (total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            fn((const void *)(uintptr_t)addr[2 * i], (int64_t)addr[2 * i + 1], o + fields * i);
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            fn((const void *)(uintptr_t)addr[2 * i], (int64_t)addr[2 * i + 1], o + fields * i);
    }
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; fields == 2 && i < n; i++)
        bad += !isfinite(o[2 * i]);
    PyMem_Free(addr);
    PyBuffer_Release(&out);
    if (fields != 2)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(bad);
}

static PyObject *moments(PyObject *self, PyObject *args)
{
    (void)self;
    return run(args, "iOw*|p:moments", "moments", OUT_FIELDS, KINDS);
}

static PyObject *squares(PyObject *self, PyObject *args)
{
    (void)self;
    return run(args, "iOw*:squares", "squares", 2, SQUARES);
}

static PyMethodDef methods[] = {
    {"moments", moments, METH_VARARGS,
     "moments(kind, [(address, element count), ...], out[, with_abs]): per tensor min, max, sum, sum of squares, sum of "
     "|x|, non-finite count, mean, l2 norm, max |x|, mean |x| as 10 float64 values into the writable buffer out"},
    {"squares", squares, METH_VARARGS,
     "squares(kind, [(address, element count), ...], out): per tensor the sum of squares and the non-finite count "
     "as 2 float64 values into the writable buffer out; returns the number of tensors whose sum is not finite"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_moments", NULL, -1, methods};

PyMODINIT_FUNC PyInit__moments(void) { return PyModule_Create(&module); }
