/* The flag section of the ring's express path (reference/ring/express.py), compiled.
 *
 * Two functions, each one message's memory accesses at one end, in the order and with the
 * clauses of RingWriter.try_publish and RingReader.try_read_single (reference/ring/protocol.py)
 * for a chunk that holds one in-ring buffer. express.py holds the same two functions in
 * Python (python_flag_section) for an interpreter where this module was not built; both are
 * run over the same schedules and compared byte for byte (tests/test_ring_express.py).
 *
 *   publish_single(view, row, n_reader, chunk, body) -> bool
 *   read_single(view, row, own, chunk, limit) -> bytes | None | False
 *
 * and full_fence(), the processor's full fence alone, which ShmMemory uses as its fence
 * where this module was built (reference/ring/shm.py).
 *
 * view: a writable, contiguous byte buffer of the whole ring (the memory's direct view);
 * row: offset of the chunk's metadata row (written flag, then n_reader read flags);
 * chunk: offset of the chunk; own: offset of this reader's read flag; limit: the longest
 * buffer the reader copies (shorter than the chunk's data area).
 *
 * The fences are the processor's: a full fence is __atomic_thread_fence(SEQ_CST) (mfence on
 * x86, dmb ish on Arm); the acquire-release fence (clause ring.fence.acquire-release) is a
 * compiler barrier alone on x86, whose TSO keeps those orders (as ShmMemory's acq_rel_fence
 * is None there), and __atomic_thread_fence(ACQ_REL) elsewhere. Flags are single bytes read
 * and written with relaxed atomic loads and stores (one access each, never merged or split
 * by the compiler); the head, the body and the copy are memcpy between fences.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define FENCE_ACQ_REL() __asm__ __volatile__("" ::: "memory")
#else
#define FENCE_ACQ_REL() __atomic_thread_fence(__ATOMIC_ACQ_REL)
#endif
#define FENCE_FULL() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* The framing of one in-ring buffer (ring.framing): marker IN_RING (0), the buffer count 1
 * as 2 bytes big-endian, the buffer's length as 4 bytes big-endian, then the buffer. */
#define FIRST_DATA 7

static int
offsets(PyObject *const *args, Py_ssize_t nargs, const char *name, Py_ssize_t *out)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "%s takes 5 arguments, got %zd", name, nargs);
        return -1;
    }
    for (int i = 1; i < 4; i++) {
        out[i - 1] = PyLong_AsSsize_t(args[i]);
        if (out[i - 1] == -1 && PyErr_Occurred())
            return -1;
        if (out[i - 1] < 0) {
            PyErr_Format(PyExc_IndexError, "%s: argument %d is negative", name, i);
            return -1;
        }
    }
    return 0;
}

static PyObject *
publish_single(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t at[3];  /* row, n_reader, chunk */
    if (offsets(args, nargs, "publish_single", at) < 0)
        return NULL;
    Py_ssize_t row = at[0], n_reader = at[1], chunk = at[2];
    PyObject *body = args[4];
    if (!PyBytes_CheckExact(body)) {
        PyErr_Format(PyExc_TypeError, "publish_single: body must be bytes, not %.100s",
                     Py_TYPE(body)->tp_name);
        return NULL;
    }
    Py_ssize_t length = PyBytes_GET_SIZE(body);
    if (length > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_OverflowError, "publish_single: body longer than 4 bytes say");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (row + 1 + n_reader > view.len || chunk + FIRST_DATA + length > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "publish_single: offset past the ring's memory");
        return NULL;
    }
    unsigned char *mem = (unsigned char *)view.buf;
    unsigned char *written = mem + row, *flags = mem + row + 1;
    FENCE_FULL();  /* ring.writer.fence-before-check */
    if (LOAD(written)) {  /* ring.writer.wait-writable: written == 0, or every read flag set */
        for (Py_ssize_t i = 0; i < n_reader; i++) {
            if (LOAD(flags + i) != 1) {
                PyBuffer_Release(&view);
                Py_RETURN_FALSE;
            }
        }
    }
    STORE(written, 0);  /* ring.writer.clear-written-before-fill */
    FENCE_ACQ_REL();    /* ring.writer.fence-after-claim */
    unsigned char head[FIRST_DATA] = {
        0, 0, 1,
        (unsigned char)(length >> 24), (unsigned char)(length >> 16),
        (unsigned char)(length >> 8), (unsigned char)length,
    };
    memcpy(mem + chunk, head, FIRST_DATA);
    memcpy(mem + chunk + FIRST_DATA, PyBytes_AS_STRING(body), (size_t)length);
    for (Py_ssize_t i = 0; i < n_reader; i++)  /* ring.writer.read-flags-cleared-before-written */
        STORE(flags + i, 0);
    FENCE_ACQ_REL();    /* ring.writer.fence-before-written */
    STORE(written, 1);
    FENCE_FULL();       /* ring.writer.fence-after-written */
    PyBuffer_Release(&view);
    Py_RETURN_TRUE;
}

static PyObject *
read_single(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t at[3];  /* row, own, chunk */
    if (offsets(args, nargs, "read_single", at) < 0)
        return NULL;
    Py_ssize_t row = at[0], own = at[1], chunk = at[2];
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (row >= view.len || own >= view.len || chunk + FIRST_DATA > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "read_single: offset past the ring's memory");
        return NULL;
    }
    unsigned char *mem = (unsigned char *)view.buf;
    FENCE_FULL();  /* ring.reader.fence-before-check */
    /* ring.reader.readable-iff, ring.reader.own-flag-loaded-first */
    if (LOAD(mem + own) || !LOAD(mem + row)) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    FENCE_ACQ_REL();  /* ring.reader.fence-before-data */
    const unsigned char *head = mem + chunk;
    Py_ssize_t count = ((Py_ssize_t)head[1] << 8) | head[2];
    Py_ssize_t length = ((Py_ssize_t)head[3] << 24) | ((Py_ssize_t)head[4] << 16)
                        | ((Py_ssize_t)head[5] << 8) | (Py_ssize_t)head[6];
    if (head[0] != 0 || count != 1 || length > limit
            || chunk + FIRST_DATA + length > view.len) {
        /* Not one in-ring buffer: the chunk stays acquired for the general path. */
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    /* Copied before the release: the writer may reuse the slot meanwhile. */
    PyObject *data = PyBytes_FromStringAndSize((const char *)head + FIRST_DATA, length);
    if (data == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    FENCE_ACQ_REL();  /* ring.reader.fence-before-release */
    STORE(mem + own, 1);
    FENCE_FULL();     /* ring.reader.fence-after-release */
    PyBuffer_Release(&view);
    return data;
}

static PyObject *
full_fence(PyObject *module, PyObject *unused)
{
    FENCE_FULL();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"full_fence", full_fence, METH_NOARGS,
     "full_fence() -> None: a full memory barrier (every load and store before it completes "
     "before any after it starts), in one call."},
    {"publish_single", (PyCFunction)(void (*)(void))publish_single, METH_FASTCALL,
     "publish_single(view, row, n_reader, chunk, body) -> bool: the chunk was free and now "
     "holds body (head, body, read flags cleared, written set, with their fences)."},
    {"read_single", (PyCFunction)(void (*)(void))read_single, METH_FASTCALL,
     "read_single(view, row, own, chunk, limit) -> bytes | None | False: a private copy of "
     "the chunk's one buffer, released; None: nothing readable; False: readable but not one "
     "in-ring buffer of at most limit bytes (nothing released)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_express_flags",
    "The flag section of the ring's express path, compiled (see express.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__express_flags(void)
{
    return PyModule_Create(&module);
}
