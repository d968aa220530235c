/* Copies into the writer process's shared-memory ring, and the atomics of the ring's shared counters.
 *
 * gather(dst_address, [(src_address, nbytes), ...]) copies the sources back to back to dst in one call (memcpy
 * each; the GIL released from 1 MiB): a saving step's hundreds of tensors cost one Python call, not one
 * ctypes.memmove each (bench/speed_paths.py --path gather). The caller guarantees the addresses are valid,
 * contiguous and do not overlap. gather_stream(...) does the same with non-temporal stores on x86-64 (sources of
 * 4 KiB or more): the copy into the writer process's ring, which the training process never reads back, does not
 * push the step's working set (weights, gradients, activations) out of the training core's caches
 * (bench/trainers_overhead.py --blocks: ~2% of a small Lightning job's step time, measured beside memcpy). The
 * ring's shared counters are read and written with the atomics below (see docs/transport.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define RELEASE_GIL_BYTES (1 << 20)

/* addr: n pairs (source address, byte count), copied back to back to d */
static void copy_all(char *d, const uint64_t *addr, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(d, (const char *)(uintptr_t)addr[2 * i], (size_t)addr[2 * i + 1]);
        d += addr[2 * i + 1];
    }
}

#if defined(__x86_64__)
#include <emmintrin.h>

#define STREAM_MIN_BYTES 4096

/* n bytes from s to d: non-temporal 16-byte stores from d's first 16-byte boundary on, memcpy for the edges */
static void stream_one(char *d, const char *s, size_t n)
{
    if (n < STREAM_MIN_BYTES) {
        memcpy(d, s, n);
        return;
    }
    size_t lead = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, lead);
    d += lead;
    s += lead;
    n -= lead;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
}

/* copy_all with non-temporal stores; the fence orders them before the stores that publish the copy */
static void stream_all(char *d, const uint64_t *addr, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        stream_one(d, (const char *)(uintptr_t)addr[2 * i], (size_t)addr[2 * i + 1]);
        d += addr[2 * i + 1];
    }
    _mm_sfence();
}
#else
#define stream_all copy_all
#endif

/* The (address, nbytes) pairs of `sources` into a new array (PyMem_Free it); NULL with an exception set */
static uint64_t *parse_sources(PyObject *sources, Py_ssize_t *n_out, uint64_t *total_out)
{
    PyObject *seq = PySequence_Fast(sources, "sources must be a sequence of (address, nbytes)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *addr = PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(n > 0 ? n : 1));
    if (addr == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long a, k;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK:sources", &a, &k)) {
            PyMem_Free(addr);
            Py_DECREF(seq);
            return NULL;
        }
        addr[2 * i] = a;
        addr[2 * i + 1] = k;
        total += k;
    }
    Py_DECREF(seq);
    *n_out = n;
    *total_out = total;
    return addr;
}

static void copy_sources(char *d, const uint64_t *addr, Py_ssize_t n, uint64_t total,
                         void (*copy)(char *, const uint64_t *, Py_ssize_t))
{
    if (total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        copy(d, addr, n);
        Py_END_ALLOW_THREADS
    } else {
        copy(d, addr, n);
    }
}

static PyObject *gather_with(PyObject *args, const char *format, void (*copy)(char *, const uint64_t *, Py_ssize_t))
{
    unsigned long long dst;
    PyObject *sources;
    if (!PyArg_ParseTuple(args, format, &dst, &sources))
        return NULL;
    Py_ssize_t n;
    uint64_t total;
    uint64_t *addr = parse_sources(sources, &n, &total);
    if (addr == NULL)
        return NULL;
    copy_sources((char *)(uintptr_t)dst, addr, n, total, copy);
    PyMem_Free(addr);
    return PyLong_FromUnsignedLongLong(total);
}

static PyObject *gather(PyObject *self, PyObject *args)
{
    (void)self;
    return gather_with(args, "KO:gather", copy_all);
}

static PyObject *gather_stream(PyObject *self, PyObject *args)
{
    (void)self;
    return gather_with(args, "KO:gather_stream", stream_all);
}

/* The ring's shared counters (head, tail, the step mark's seqlock) are int64 slots written by one process and
 * read by the other. store_release(addr, value) / load_acquire(addr) make every write before a release visible
 * to a reader whose acquire sees it, on any CPU (x86-64's stores are ordered anyway; aarch64's are not).
 * put_mark(addr, seq, fields...) writes a seqlock-protected record: seq+1 (odd: being written), the fields, seq+2,
 * with release ordering; get_mark(addr, n) reads one, or None while it is being written. */
static PyObject *store_release(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long addr;
    long long value;
    if (!PyArg_ParseTuple(args, "KL:store_release", &addr, &value))
        return NULL;
    __atomic_store_n((int64_t *)(uintptr_t)addr, (int64_t)value, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *load_acquire(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K:load_acquire", &addr))
        return NULL;
    return PyLong_FromLongLong((long long)__atomic_load_n((int64_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE));
}

#define MARK_FIELDS 6

static PyObject *put_mark(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long addr;
    long long seq, f[MARK_FIELDS];
    if (!PyArg_ParseTuple(args, "KLLLLLLL:put_mark", &addr, &seq, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]))
        return NULL;
    int64_t *slot = (int64_t *)(uintptr_t)addr;
    __atomic_store_n(&slot[0], (int64_t)(seq + 1), __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (int i = 0; i < MARK_FIELDS; i++)
        __atomic_store_n(&slot[1 + i], (int64_t)f[i], __ATOMIC_RELAXED);
    __atomic_store_n(&slot[0], (int64_t)(seq + 2), __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *get_mark(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K:get_mark", &addr))
        return NULL;
    int64_t *slot = (int64_t *)(uintptr_t)addr;
    int64_t f[MARK_FIELDS];
    int64_t s1 = __atomic_load_n(&slot[0], __ATOMIC_ACQUIRE);
    if (s1 & 1)
        Py_RETURN_NONE;
    for (int i = 0; i < MARK_FIELDS; i++)
        f[i] = __atomic_load_n(&slot[1 + i], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&slot[0], __ATOMIC_RELAXED) != s1)
        Py_RETURN_NONE;
    return Py_BuildValue("(LLLLLLL)", (long long)s1, (long long)f[0], (long long)f[1], (long long)f[2],
                         (long long)f[3], (long long)f[4], (long long)f[5]);
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS,
     "gather(dst_address, [(src_address, nbytes), ...]) -> bytes copied, in one call"},
    {"gather_stream", gather_stream, METH_VARARGS,
     "gather_stream(dst_address, [(src_address, nbytes), ...]) -> bytes copied, with non-temporal stores"},
    {"store_release", store_release, METH_VARARGS, "store_release(address, value): an int64 store, release"},
    {"load_acquire", load_acquire, METH_VARARGS, "load_acquire(address) -> int64, acquire"},
    {"put_mark", put_mark, METH_VARARGS, "put_mark(address, seq, 6 int64 fields): a seqlock-protected write"},
    {"get_mark", get_mark, METH_VARARGS, "get_mark(address) -> (seq, 6 fields) or None while being written"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_streamcopy", NULL, -1, methods};

PyMODINIT_FUNC PyInit__streamcopy(void) { return PyModule_Create(&module); }
