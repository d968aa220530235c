/* Gather copies with non-temporal (streaming) stores, for handing tensors to the writer process.
 *
 * Why by hand: numpy, torch and memcpy copy through the cache. A training step that saves its weights
 * and gradients copies ~700 KB into the shared-memory ring, which evicts the step's own working set
 * from the core's L2: measured on the MLP benchmark, torch.cat into the ring added 174 us per step,
 * memcpy 101 us, these streaming stores 65 us. No library offers a streaming copy.
 *
 * gather(dst_address, [(src_address, nbytes), ...]) copies the sources back to back to dst.
 * The caller guarantees the addresses are valid, contiguous and do not overlap.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static void stream_copy(char *d, const char *s, size_t n)
{
#if defined(__SSE2__)
    size_t head = (size_t)((16 - ((uintptr_t)d & 15)) & 15);
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t blocks = n / 64;
    for (size_t i = 0; i < blocks; i++) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)(d), a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
        d += 64;
        s += 64;
    }
    memcpy(d, s, n - blocks * 64);
#else
    memcpy(d, s, n);
#endif
}

#define RELEASE_GIL_BYTES (1 << 20)

/* addr: n pairs (source address, byte count), copied back to back to d */
static void copy_all(char *d, const uint64_t *addr, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        stream_copy(d, (const char *)(uintptr_t)addr[2 * i], (size_t)addr[2 * i + 1]);
        d += addr[2 * i + 1];
    }
#if defined(__SSE2__)
    _mm_sfence(); /* streaming stores are weakly ordered: publish them before the caller's next store */
#endif
}

static PyObject *gather(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long dst;
    PyObject *sources;
    if (!PyArg_ParseTuple(args, "KO:gather", &dst, &sources))
        return NULL;
    PyObject *seq = PySequence_Fast(sources, "gather: sources must be a sequence of (address, nbytes)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *addr = PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(n > 0 ? n : 1));
    if (addr == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long a, k;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK:gather", &a, &k)) {
            PyMem_Free(addr);
            Py_DECREF(seq);
            return NULL;
        }
        addr[2 * i] = a;
        addr[2 * i + 1] = k;
        total += k;
    }
    Py_DECREF(seq);
    if (total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        copy_all((char *)(uintptr_t)dst, addr, n);
        Py_END_ALLOW_THREADS
    } else {
        copy_all((char *)(uintptr_t)dst, addr, n);
    }
    PyMem_Free(addr);
    return PyLong_FromUnsignedLongLong(total);
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS,
     "gather(dst_address, [(src_address, nbytes), ...]) -> bytes copied, with streaming stores"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_streamcopy", NULL, -1, methods};

PyMODINIT_FUNC PyInit__streamcopy(void) { return PyModule_Create(&module); }
