/* The small-message path's replay in one C call (see topologies/persistent.py).
 *
 * A recorded schedule is compiled, once, into a program of 64-bit words; replaying it
 * here runs every step's Startall + Waitall, the received lengths' check and the adds
 * without returning to Python between rounds.  The program knows no algorithm: it is
 * the schedule the topology's own blocking code recorded, in the recorded order, so the
 * sums are the same sums in the same order (the same bits) as the Python replay.
 *
 * Ops (one after another; every field an int64):
 *   EXCHANGE n first nrecv  [req_index expected datatype]*nrecv  [status_address]*n
 *       MPI_Startall + MPI_Waitall of requests[first .. first+n), then MPI_Get_count of
 *       each receive against its expected element count.  On an error or a wrong count
 *       the statuses are copied into the caller's MPI.Status objects and the call
 *       returns (op index, MPI error code, or -1 for a wrong count), so that Python
 *       raises exactly what the Python replay raises.
 *   ADD dtype count dst src      dst[i] += src[i], float32 (dtype 0) or float64 (1)
 *
 * run(requests_address, program_address, words) returns None, or (op, code).
 * Built by topologies/build_replay.py against the MPI that mpi4py loads (MPICH's ABI).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi.h>
#include <stdint.h>
#include <string.h>

enum { OP_EXCHANGE = 1, OP_ADD = 2 };
#define MAX_REQUESTS 64

/* Run the program: 0, or the failed exchange's word index + 1, its code in *code_out.
 * Touches no Python object: it runs with the GIL released, as mpi4py's own blocking
 * calls do, so that the watchdog's and the progress thread's Python code runs while a
 * rank waits here for a peer. */
static int64_t execute(MPI_Request *requests, const int64_t *prog, int64_t words,
                       int *code_out) {
    MPI_Status statuses[MAX_REQUESTS];
    int64_t pc = 0;
    while (pc < words) {
        int64_t at = pc;
        if (prog[pc] == OP_ADD) {
            int64_t count = prog[pc + 2];
            if (prog[pc + 1] == 0) {
                float *dst = (float *)(intptr_t)prog[pc + 3];
                const float *src = (const float *)(intptr_t)prog[pc + 4];
                for (int64_t i = 0; i < count; i++)
                    dst[i] = dst[i] + src[i];
            } else {
                double *dst = (double *)(intptr_t)prog[pc + 3];
                const double *src = (const double *)(intptr_t)prog[pc + 4];
                for (int64_t i = 0; i < count; i++)
                    dst[i] = dst[i] + src[i];
            }
            pc += 5;
            continue;
        }
        int n = (int)prog[pc + 1];
        MPI_Request *reqs = requests + prog[pc + 2];
        int64_t nrecv = prog[pc + 3];
        const int64_t *recvs = prog + pc + 4;
        const int64_t *status_addresses = recvs + 3 * nrecv;
        pc += 4 + 3 * nrecv + n;
        int code = MPI_Startall(n, reqs);
        if (code != MPI_SUCCESS) {
            *code_out = code;
            return at + 1;
        }
        code = MPI_Waitall(n, reqs, statuses);
        int wrong = 0;
        if (code == MPI_SUCCESS) {
            for (int64_t r = 0; r < nrecv; r++) {
                int got = 0;
                MPI_Get_count(&statuses[recvs[3 * r]], (MPI_Datatype)recvs[3 * r + 2], &got);
                if (got != recvs[3 * r + 1])
                    wrong = 1;
            }
            if (!wrong)
                continue;
        }
        for (int i = 0; i < n; i++)
            memcpy((void *)(intptr_t)status_addresses[i], &statuses[i], sizeof(MPI_Status));
        *code_out = wrong ? -1 : code;
        return at + 1;
    }
    return 0;
}

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "run(requests_address, program_address, words)");
        return NULL;
    }
    MPI_Request *requests = (MPI_Request *)PyLong_AsVoidPtr(args[0]);
    const int64_t *prog = (const int64_t *)PyLong_AsVoidPtr(args[1]);
    Py_ssize_t words = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    int code = 0;
    int64_t failed;
    Py_BEGIN_ALLOW_THREADS
    failed = execute(requests, prog, (int64_t)words, &code);
    Py_END_ALLOW_THREADS
    if (failed == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(Li)", (long long)(failed - 1), code);
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "Replay a compiled schedule: None, or (op index, MPI error code or -1)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mpirl_replay", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__mpirl_replay(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    /* callable before MPI_Init: the library this module was linked against */
    MPI_Get_library_version(version, &length);
    if (PyModule_AddIntConstant(m, "request_size", (long)sizeof(MPI_Request)) < 0
        || PyModule_AddIntConstant(m, "datatype_size", (long)sizeof(MPI_Datatype)) < 0
        || PyModule_AddIntConstant(m, "max_requests", MAX_REQUESTS) < 0
        || PyModule_AddStringConstant(m, "library_version", version) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
