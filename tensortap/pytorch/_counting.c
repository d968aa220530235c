/* The step counter's truth test in C (see _step_counter.py for what it does and why).
 *
 * Why by hand: `CountingHooks.__bool__` runs on every forward of the model's root, including every
 * forward that saves nothing. In Python it is a call, a frame and `sys._getframe(1)` (which makes a
 * frame object for `_call_impl`): measured ~4-5 us per quiet step inside the MLP benchmark's training
 * step, where the code and data it touches are out of the caches. Here it is a type slot that compares
 * one pointer and decrements a counter. No library does this.
 *
 * CountingBase is an OrderedDict (what torch keeps in `_backward_hooks`) with four attributes:
 *   tick      callable or None: called on each counted call of the module
 *   left      calls still to skip (counted in `skipped` instead) while the clock is before `deadline`
 *   skipped   calls skipped so far (the owner adds them to its step counters and resets it)
 *   deadline  time.monotonic() value after which skipping stops
 * configure(code, report) sets the code object of `Module._call_impl` (only truth tests made directly by
 * it count) and the callable that is given the exception when `tick` raises an Exception (`tick` is then
 * cleared; a BaseException such as a requested stop of the training goes through).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

typedef struct {
    PyObject *tick;
    Py_ssize_t left;
    Py_ssize_t skipped;
    double deadline;
} CountState;

static Py_ssize_t state_offset; /* where CountState starts in an instance (after the OrderedDict) */
static PyObject *call_impl_code;  /* strong reference, set by configure() */
static PyObject *report_error;    /* strong reference, set by configure() */

#define STATE(op) ((CountState *)((char *)(op) + state_offset))

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
/* CPython 3.11's _PyInterpreterFrame (Include/internal/pycore_frame.h) begins with these fields; the
 * running frame is tstate->cframe->current_frame. Reading it makes no frame object. */
typedef struct {
    PyObject *f_func;
    PyObject *f_globals;
    PyObject *f_builtins;
    PyObject *f_locals;
    PyObject *f_code;
} frame_head;

static int called_from_call_impl(void)
{
    PyThreadState *ts = PyThreadState_GET();
    const frame_head *f = (const frame_head *)ts->cframe->current_frame;
    return f != NULL && f->f_code == call_impl_code;
}
#else
static int called_from_call_impl(void)
{
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    if (f == NULL)
        return 0;
    PyCodeObject *code = PyFrame_GetCode(f);
    int same = (PyObject *)code == call_impl_code;
    Py_DECREF(code);
    return same;
}
#endif

static double monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock of time.monotonic() */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void tick_failed(CountState *s)
{
    /* never break the forward it sits in: stop counting, hand the exception to report_error */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_CLEAR(s->tick);
    if (report_error != NULL && value != NULL) {
        PyObject *r = PyObject_CallOneArg(report_error, value);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static int counting_bool(PyObject *op)
{
    if (call_impl_code != NULL && called_from_call_impl()) {
        CountState *s = STATE(op);
        if (s->left > 0 && monotonic() < s->deadline) {
            s->left--;
            s->skipped++;
        }
        else if (s->tick != NULL && s->tick != Py_None) {
            PyObject *tick = s->tick;
            Py_INCREF(tick);
            PyObject *r = PyObject_CallNoArgs(tick);
            Py_DECREF(tick);
            if (r == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_Exception))
                    return -1; /* e.g. TrainingStopped (a BaseException): meant to end the training */
                tick_failed(s);
            }
            else
                Py_DECREF(r);
        }
    }
    return PyDict_GET_SIZE(op) > 0;
}

static int counting_traverse(PyObject *op, visitproc visit, void *arg)
{
    Py_VISIT(STATE(op)->tick);
    return PyODict_Type.tp_traverse(op, visit, arg);
}

static int counting_clear(PyObject *op)
{
    Py_CLEAR(STATE(op)->tick);
    return PyODict_Type.tp_clear(op);
}

static void counting_dealloc(PyObject *op)
{
    PyObject_GC_UnTrack(op); /* (the OrderedDict's dealloc untracks too: untracking twice is allowed) */
    Py_CLEAR(STATE(op)->tick);
    PyODict_Type.tp_dealloc(op);
}

static PyMemberDef counting_members[] = {
    {"tick", T_OBJECT, 0, 0, "called on each counted call (None: nothing)"},
    {"left", T_PYSSIZET, 0, 0, "calls still to skip"},
    {"skipped", T_PYSSIZET, 0, 0, "calls skipped so far"},
    {"deadline", T_DOUBLE, 0, 0, "time.monotonic() after which nothing is skipped"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot counting_slots[] = {
    {Py_nb_bool, counting_bool},
    {Py_tp_traverse, counting_traverse},
    {Py_tp_clear, counting_clear},
    {Py_tp_dealloc, counting_dealloc},
    {Py_tp_members, counting_members},
    {Py_tp_doc, "An OrderedDict whose truth test, made by Module._call_impl, counts the call."},
    {0, NULL},
};

static PyType_Spec counting_spec = {
    "tensortap.pytorch._counting.CountingBase",
    0, /* basicsize: set at import, after the OrderedDict's */
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    counting_slots,
};

static PyObject *configure(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *code, *report;
    if (!PyArg_ParseTuple(args, "OO:configure", &code, &report))
        return NULL;
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "configure: code must be a code object");
        return NULL;
    }
    Py_INCREF(code);
    Py_INCREF(report);
    Py_XSETREF(call_impl_code, code);
    Py_XSETREF(report_error, report);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(code of Module._call_impl, report(exception))"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_counting", "The step counter's truth test (see _step_counter.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__counting(void)
{
    Py_ssize_t align = (Py_ssize_t)sizeof(double);
    state_offset = (PyODict_Type.tp_basicsize + align - 1) / align * align;
    counting_spec.basicsize = (int)(state_offset + (Py_ssize_t)sizeof(CountState));
    counting_members[0].offset = state_offset + offsetof(CountState, tick);
    counting_members[1].offset = state_offset + offsetof(CountState, left);
    counting_members[2].offset = state_offset + offsetof(CountState, skipped);
    counting_members[3].offset = state_offset + offsetof(CountState, deadline);

    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *type = PyType_FromSpecWithBases(&counting_spec, (PyObject *)&PyODict_Type);
    if (type == NULL || PyModule_AddObject(m, "CountingBase", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
