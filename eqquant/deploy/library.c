/* The C side of a program saved ahead of time (eqquant.deploy): its run loop on the OpenMP
 * thread pool, and the few functions of Numba's runtime that the kernels' compiled code
 * calls, so that the library loads in a process that never imports Numba.
 *
 * A program is a table of launches, each a kernel's C entry `void entry(block, thread,
 * threads)` on its argument block (runtime/codegen/launch.py): eqq_run makes them in order, each
 * on `count` threads (1: the calling thread alone, as thread 0 of 1; 0: the pool's).
 * Numba's own launcher runs the same entries on the same OpenMP pool (its "omp" threading
 * layer, one `omp parallel for` per launch), so a part sees the same thread and threads.
 *
 * Numba's runtime, as the kernels use it: NRT's memory-info blocks (an allocation inside a
 * kernel), the no-copy reshape of helperlib, and the functions its generated code calls
 * on an error path only (a kernel cannot raise: what could fail is checked before the
 * launch). Those set a Python error that names the library, as a C function reports one:
 * written out as unraisable by the entry's wrapper. Numba 0.68's layouts are assumed
 * (MemInfo's fields); eqquant pins that Numba, and tests/test_deploy.py compares these
 * with Numba's own.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef void (*eqq_entry)(int64_t block, int64_t thread, int64_t threads);

typedef struct {
    eqq_entry entry;
    int64_t block;
    int64_t count;   /* threads it runs as; 0: the pool's */
} eqq_launch;

/* Run `n` launches in order, a launch of count 0 on `pool` threads. */
void eqq_run(const eqq_launch *launches, int64_t n, int64_t pool)
{
    for (int64_t i = 0; i < n; i++) {
        const eqq_launch *l = &launches[i];
        int64_t count = l->count > 0 ? l->count : pool;
        if (count <= 1) {
            l->entry(l->block, 0, 1);
            continue;
        }
        int team = (int)(count < pool ? count : pool);
        #pragma omp parallel for schedule(static) num_threads(team)
        for (int64_t t = 0; t < count; t++)
            l->entry(l->block, t, count);
    }
}

/* eqq_run, each launch's wall time (seconds) added to seconds[i] (a profile). */
void eqq_run_timed(const eqq_launch *launches, int64_t n, int64_t pool, double *seconds)
{
    for (int64_t i = 0; i < n; i++) {
        double t0 = omp_get_wtime();
        eqq_run(&launches[i], 1, pool);
        seconds[i] += omp_get_wtime() - t0;
    }
}

/* Ask Linux for the AMX tile state, which a process gets only when it asks (as
 * runtime/kernels/amx.py asks for a process running the kernels with Numba): 1 where granted. */
int eqq_request_tiles(void)
{
#if defined(__linux__) && defined(__x86_64__)
    const long get_perm = 0x1022, req_perm = 0x1023, xtiledata = 18;
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, req_perm, xtiledata) != 0)
        return 0;
    if (syscall(SYS_arch_prctl, get_perm, &granted) != 0)
        return 0;
    return (int)(granted >> xtiledata & 1);
#else
    return 0;
#endif
}

/* -- Numba's runtime, as far as the kernels call it ------------------------------------ */

typedef void (*nrt_dtor)(void *data, size_t size, void *info);

typedef struct {           /* Numba's NRT_MemInfo (numba/core/runtime/nrt.cpp) */
    size_t refct;
    nrt_dtor dtor;
    void *dtor_info;
    void *data;
    size_t size;
    void *external_allocator;
} nrt_meminfo;

void *NRT_MemInfo_alloc_aligned(size_t size, unsigned align)
{
    if (align == 0)
        align = 1;
    nrt_meminfo *mi = malloc(sizeof(nrt_meminfo) + size + 2 * (size_t)align);
    if (mi == NULL)
        return NULL;
    uintptr_t start = (uintptr_t)(mi + 1);
    start += (align - start % align) % align;
    mi->refct = 1;
    mi->dtor = NULL;
    mi->dtor_info = NULL;
    mi->data = (void *)start;
    mi->size = size;
    mi->external_allocator = NULL;
    return mi;
}

void NRT_MemInfo_call_dtor(nrt_meminfo *mi)
{
    if (mi->dtor != NULL)
        mi->dtor(mi->data, mi->size, mi->dtor_info);
    free(mi);
}

void NRT_Free(void *ptr)
{
    free(ptr);
}

/* numpy's rule for a reshape without a copy: the new strides, or 0 where the old axes that
 * a new axis spans are not laid out as one. */
int numba_attempt_nocopy_reshape(int64_t nd, const int64_t *dims, const int64_t *strides,
                                 int64_t newnd, const int64_t *newdims, int64_t *newstrides,
                                 int64_t itemsize, int is_f_order)
{
    int64_t olddims[64], oldstrides[64];
    int64_t oldnd = 0, old_n = 1, new_n = 1;
    if (nd > 64)
        return 0;
    for (int64_t i = 0; i < nd; i++) {
        if (dims[i] != 1) {     /* axes of length 1 take no part */
            olddims[oldnd] = dims[i];
            oldstrides[oldnd] = strides[i];
            oldnd++;
        }
    }
    for (int64_t i = 0; i < oldnd; i++)
        old_n *= olddims[i];
    for (int64_t i = 0; i < newnd; i++)
        new_n *= newdims[i];
    if (old_n != new_n)
        return 0;
    if (new_n == 0) {           /* an empty array: any strides do; its items' size */
        for (int64_t i = 0; i < newnd; i++)
            newstrides[i] = itemsize;
        return 1;
    }
    int64_t oi = 0, oj = 1, ni = 0, nj = 1;
    while (ni < newnd && oi < oldnd) {
        int64_t np_ = newdims[ni], op = olddims[oi];
        while (np_ != op) {     /* the smallest run of axes of equal size on both sides */
            if (np_ < op)
                np_ *= newdims[nj++];
            else
                op *= olddims[oj++];
        }
        for (int64_t ok = oi; ok < oj - 1; ok++) {   /* those old axes: one run? */
            if (is_f_order) {
                if (oldstrides[ok + 1] != olddims[ok] * oldstrides[ok])
                    return 0;
            } else if (oldstrides[ok] != olddims[ok + 1] * oldstrides[ok + 1]) {
                return 0;
            }
        }
        if (is_f_order) {
            newstrides[ni] = oldstrides[oi];
            for (int64_t nk = ni + 1; nk < nj; nk++)
                newstrides[nk] = newstrides[nk - 1] * newdims[nk - 1];
        } else {
            newstrides[nj - 1] = oldstrides[oj - 1];
            for (int64_t nk = nj - 1; nk > ni; nk--)
                newstrides[nk - 1] = newstrides[nk] * newdims[nk];
        }
        ni = nj++;
        oi = oj++;
    }
    int64_t last = ni >= 1 ? newstrides[ni - 1] : itemsize;   /* trailing axes of 1 */
    if (is_f_order && ni >= 1)
        last *= newdims[ni - 1];
    for (int64_t nk = ni; nk < newnd; nk++)
        newstrides[nk] = last;
    return 1;
}

/* The error paths: Python's own functions, declared here (no Python headers needed). */
typedef struct _object PyObject;
extern PyObject *PyExc_RuntimeError;
extern void PyErr_SetString(PyObject *type, const char *message);
extern int PyGILState_Ensure(void);
extern void PyGILState_Release(int state);

static const char RAISED[] =
    "eqquant: a kernel of a program saved ahead of time raised an exception "
    "(its message is not kept in the library); run the program with the Numba executor "
    "(EQQUANT_DEPLOY=0) to see it";

void numba_gil_ensure(int *state)
{
    *state = PyGILState_Ensure();
}

void numba_gil_release(int *state)
{
    PyGILState_Release(*state);
}

PyObject *numba_unpickle(const char *data, int n, const char *hashed)
{
    (void)data; (void)n; (void)hashed;
    PyErr_SetString(PyExc_RuntimeError, RAISED);
    return NULL;
}

PyObject *numba_runtime_build_excinfo_struct(PyObject *a, PyObject *b)
{
    (void)a; (void)b;
    PyErr_SetString(PyExc_RuntimeError, RAISED);
    return NULL;
}

int numba_do_raise(PyObject *excinfo)
{
    (void)excinfo;
    PyErr_SetString(PyExc_RuntimeError, RAISED);
    return 0;
}
