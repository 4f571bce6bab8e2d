"""MPICH's own collective algorithms, forced at run time through the MPI tool interface.

MPICH chooses a collective's algorithm from control variables (CVARs) such as
``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``.  They are usually set in the environment, read
once at ``MPI_Init``; but they are also MPI_T control variables of scope ``ALL_EQ``,
which every rank may write at run time with ``MPI_T_cvar_write`` (same value on all
ranks), and MPICH reads them at every call.  That lets one benchmark run measure
``native`` with MPICH's own choice and with each forced algorithm, interleaved with the
home-made topologies, on the same ranks and at the same moment.

Forcing an algorithm sets three variables together (and restores them afterwards):

* ``MPIR_CVAR_<OP>_INTRA_ALGORITHM`` = the algorithm;
* ``MPIR_CVAR_DEVICE_COLLECTIVES`` = ``none``: otherwise the CH4 device may take the call
  (shared-memory collectives) before the algorithm switch is ever read;
* ``MPIR_CVAR_COLLECTIVE_FALLBACK`` = ``error``: by default MPICH silently falls back to
  its own choice when the forced algorithm cannot handle the arguments; with ``error``
  such a call fails instead, so a number measured under a forced algorithm is that
  algorithm's (tests show a refused call raising).

mpi4py has no MPI_T bindings; the calls go through ctypes to the ``libmpi`` that mpi4py
loaded.  The integer value of each algorithm is its position in the CVAR's description
(MPICH generates both from one list); a test checks that mapping against MPICH's own
reading of the environment variable.
"""

from __future__ import annotations

import ctypes
import re
from contextlib import contextmanager

from mpi4py import MPI

MPI_T_THREAD_MULTIPLE = 3
CVAR = {"allreduce": "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
        "bcast": "MPIR_CVAR_BCAST_INTRA_ALGORITHM"}
DEVICE = "MPIR_CVAR_DEVICE_COLLECTIVES"
FALLBACK = "MPIR_CVAR_COLLECTIVE_FALLBACK"


class MpichError(RuntimeError):
    """The MPI library is not MPICH, or its tool interface refused a call."""


def _libmpi() -> ctypes.CDLL:
    with open("/proc/self/maps") as maps:
        for line in maps:
            match = re.search(r"(/\S*/libmpi[^/\s]*\.so[^/\s]*)$", line.strip())
            if match:
                return ctypes.CDLL(match.group(1))
    raise MpichError("libmpi is not loaded in this process (import mpi4py.MPI first)")


class MpichTuning:
    """Read and force MPICH's collective algorithm choices on this rank."""

    def __init__(self) -> None:
        if not MPI.Get_library_version().startswith("MPICH"):
            raise MpichError("forcing algorithms needs MPICH; this MPI is "
                             + MPI.Get_library_version().splitlines()[0])
        self.lib = _libmpi()
        provided = ctypes.c_int()
        self._check(self.lib.MPI_T_init_thread(MPI_T_THREAD_MULTIPLE, ctypes.byref(provided)),
                    "MPI_T_init_thread")
        self._handles: dict[str, ctypes.c_void_p] = {}
        self._choices: dict[str, list[str]] = {}

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise MpichError(f"{what} failed with MPI_T error {rc}")

    def _index(self, name: str) -> int:
        index = ctypes.c_int()
        self._check(self.lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)),
                    f"MPI_T_cvar_get_index({name})")
        return index.value

    def choices(self, name: str) -> list[str]:
        """The values a CVAR of enum kind accepts, in MPICH's order (value = position)."""
        if name not in self._choices:
            size = ctypes.c_int(256)
            dsize = ctypes.c_int(8192)
            text, desc = ctypes.create_string_buffer(256), ctypes.create_string_buffer(8192)
            verbosity, bind, scope = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
            datatype, enumtype = ctypes.c_void_p(), ctypes.c_void_p()
            self._check(self.lib.MPI_T_cvar_get_info(
                self._index(name), text, ctypes.byref(size), ctypes.byref(verbosity),
                ctypes.byref(datatype), ctypes.byref(enumtype), desc, ctypes.byref(dsize),
                ctypes.byref(bind), ctypes.byref(scope)), f"MPI_T_cvar_get_info({name})")
            lines = desc.value.decode(errors="replace").splitlines()
            self._choices[name] = [m.group(1) for line in lines
                                   if (m := re.match(r"^\s*([a-z0-9_]+)\s+- ", line))]
            if not self._choices[name]:
                raise MpichError(f"{name}: no choices in its description")
        return self._choices[name]

    def _handle(self, name: str) -> ctypes.c_void_p:
        if name not in self._handles:
            handle, count = ctypes.c_void_p(), ctypes.c_int()
            self._check(self.lib.MPI_T_cvar_handle_alloc(self._index(name), None,
                                                        ctypes.byref(handle),
                                                        ctypes.byref(count)),
                        f"MPI_T_cvar_handle_alloc({name})")
            self._handles[name] = handle
        return self._handles[name]

    def read(self, name: str) -> str:
        value = ctypes.c_int()
        self._check(self.lib.MPI_T_cvar_read(self._handle(name), ctypes.byref(value)),
                    f"MPI_T_cvar_read({name})")
        return self.choices(name)[value.value]

    def write(self, name: str, choice: str) -> None:
        allowed = self.choices(name)
        if choice not in allowed:
            raise MpichError(f"{name}={choice!r}; MPICH allows: {', '.join(allowed)}")
        value = ctypes.c_int(allowed.index(choice))
        self._check(self.lib.MPI_T_cvar_write(self._handle(name), ctypes.byref(value)),
                    f"MPI_T_cvar_write({name}={choice})")

    def algorithms(self, op: str) -> list[str]:
        return [a for a in self.choices(CVAR[op]) if a != "auto"]

    @contextmanager
    def forced(self, op: str, algorithm: str):
        """Within the block, ``op`` runs MPICH's ``algorithm`` or fails: every rank must
        enter together (the variables must be equal on all ranks)."""
        names = (CVAR[op], DEVICE, FALLBACK)
        saved = {name: self.read(name) for name in names}
        try:
            self.write(DEVICE, "none")
            self.write(FALLBACK, "error")
            self.write(CVAR[op], algorithm)
            yield
        finally:
            for name, value in saved.items():
                self.write(name, value)
