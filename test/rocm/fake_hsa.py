"""A test-side stand-in for ``libhsa-runtime64.so.1``: an object whose attributes are the
``hsa_*`` functions :mod:`poot.backends.rocm.hsa` calls, taking the same arguments (ints,
``ctypes.pointer`` out-parameters, ``CFUNCTYPE`` callbacks) and returning ``hsa_status_t``
codes, over host (Python) memory.

Simulated: one CPU agent (kernarg and fine-grained pools) and one GPU agent (coarse-grained
pool), allocations as ctypes buffers, signals as Python ints, one queue per
``hsa_queue_create`` whose ring is real memory, and a *packet processor* that runs when the
doorbell is rung: it reads the slots from its read index up to the doorbell value, refuses a
slot whose header type is still INVALID (recorded in ``violations``: the host rang before
publishing), decodes the dispatch packet, runs the Python kernel registered for its
``kernel_object`` (``kernels[name](fake, args, packet)``, ``args`` the kernarg block's
pointers), decrements its completion signal, marks the slot INVALID again and advances the
read index. ``process = False`` stops the processor (a GPU that never completes).

``log`` records, in order, every store the runtime makes into the ring through
:class:`FakeMemory` (``("write", addr, nbytes)``, ``("release32", addr, value)``), every
atomic add on a signal (``("add", signal, value)``: the store fence is an add of 0), and every
doorbell store (``("doorbell", value)``).
"""

from __future__ import annotations

import ctypes
import json
import struct

from poot.backends.rocm import aql
from poot.backends.rocm.hsa import MemoryOps

OK = 0
INFO_BREAK = 0x1
ERROR_INVALID_ARGUMENT = 0x1001
ERROR_INVALID_CODE_OBJECT = 0x1010
ERROR_INVALID_SYMBOL_NAME = 0x1013
ERROR_EXCEPTION = 0x1016
STATUS_TEXT = {ERROR_INVALID_ARGUMENT: b"HSA_STATUS_ERROR_INVALID_ARGUMENT: bad argument",
               ERROR_INVALID_CODE_OBJECT: b"HSA_STATUS_ERROR_INVALID_CODE_OBJECT",
               ERROR_INVALID_SYMBOL_NAME: b"HSA_STATUS_ERROR_INVALID_SYMBOL_NAME",
               ERROR_EXCEPTION: b"HSA_STATUS_ERROR_EXCEPTION: a queue exception"}

CPU, GPU = 1, 2                      # agent handles
COARSE, KERNARG, FINE = 10, 11, 12   # pool handles


def fake_code_object(arch: str, kernels: dict[str, dict] | list[str]) -> bytes:
    """A code object the fake loader understands: ``kernels`` name -> symbol info
    (``kernarg_size``, ``group_size``, ``private_size``; defaults 64/0/0)."""
    if isinstance(kernels, list):
        kernels = {k: {} for k in kernels}
    return b"FAKEHSACO" + json.dumps({"arch": arch, "kernels": kernels}).encode()


class FakeMemory(MemoryOps):
    """The real queue-slot stores, logged into the fake's ``log`` first."""

    def __init__(self, fake: "FakeHsa"):
        self.fake = fake

    def write(self, address, data):
        if self.fake.in_ring(address):
            self.fake.log.append(("write", address, len(data)))
        super().write(address, data)

    def store_release_u32(self, address, value):
        if self.fake.in_ring(address):
            self.fake.log.append(("release32", address, value))
        super().store_release_u32(address, value)


class FakeHsa:
    """See the module doc. ``arch``: the GPU agent's name; ``apu``: integrated GPU;
    ``queue_max``: ``HSA_AGENT_INFO_QUEUE_MAX_SIZE``; ``gpu``: whether a GPU agent exists;
    ``host_pools``: the CPU agent's pools (``KERNARG`` is fine-grained too, as in ROCr)."""

    def __init__(self, arch="gfx942", apu=False, wavefront=64, queue_max=1024, gpu=True,
                 host_pools=(KERNARG, FINE)):
        self.arch, self.apu, self.wavefront, self.queue_max = arch, apu, wavefront, queue_max
        self.host_pools = list(host_pools)
        self.agents = [CPU, GPU] if gpu else [CPU]
        self.allocs: dict[int, tuple] = {}     # address -> (buffer, nbytes, pool)
        self.signals: dict[int, int] = {}
        self._next = 100
        self.log: list[tuple] = []
        self.calls: list[str] = []
        self.violations: list[str] = []
        self.processed: list[bytes] = []
        self.kernels: dict = {}                # name -> fn(fake, args, packet)
        self._objects: dict[int, dict] = {}    # kernel_object -> symbol info
        self._readers: dict[int, dict] = {}
        self._exes: dict[int, dict] = {}
        self._strings: list = []
        self.process = True
        self.queue = None
        self.allowed: list[tuple] = []
        self.initialized = 0
        self.memory = FakeMemory(self)

    # ---- plumbing ----------------------------------------------------------------------
    def _handle(self) -> int:
        self._next += 1
        return self._next

    def _alloc(self, n: int, pool: int) -> int:
        b = ctypes.create_string_buffer(int(n) + 64)
        p = (ctypes.addressof(b) + 63) // 64 * 64
        self.allocs[p] = (b, int(n), pool)
        return p

    def known(self, address: int, n: int) -> bool:
        """Whether ``[address, address + n)`` lies in one fake allocation."""
        return any(p <= address and address + n <= p + m
                   for p, (_, m, _) in self.allocs.items())

    def in_ring(self, address: int) -> bool:
        q = self.queue
        return q is not None and q["base"] <= address < q["base"] + q["size"] * 64

    def __getattribute__(self, name):
        if name.startswith("hsa_"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    # ---- init, status, system ----------------------------------------------------------
    def hsa_init(self):
        self.initialized += 1
        return OK

    def hsa_shut_down(self):
        self.initialized -= 1
        return OK

    def hsa_status_string(self, status, out):
        s = ctypes.c_char_p(STATUS_TEXT.get(int(status), b"HSA_STATUS_ERROR (fake)"))
        self._strings.append(s)
        out.contents.value = s.value
        return OK

    def hsa_system_get_info(self, attr, out):
        if attr == 3:                                  # TIMESTAMP_FREQUENCY
            out.contents.value = 1_000_000_000
            return OK
        return ERROR_INVALID_ARGUMENT

    # ---- agents, pools -----------------------------------------------------------------
    def hsa_iterate_agents(self, cb, data):
        for a in self.agents:
            r = cb(a, data)
            if r != OK:
                return r
        return OK

    def hsa_agent_get_info(self, agent, attr, out):
        gpu = agent == GPU
        if attr == 0:                                  # NAME
            out.contents.value = (self.arch if gpu else "fake-cpu").encode()
        elif attr == 17:                               # DEVICE
            out.contents.value = 1 if gpu else 0
        elif attr == 6:
            out.contents.value = self.wavefront if gpu else 0
        elif attr == 14:
            out.contents.value = self.queue_max if gpu else 0
        elif attr == 0xA114:                           # MEMORY_PROPERTIES: IS_APU = bit 1
            out.contents[0] = 0b10 if (gpu and self.apu) else 0
        else:
            return ERROR_INVALID_ARGUMENT
        return OK

    def hsa_amd_agent_iterate_memory_pools(self, agent, cb, data):
        for p in ([COARSE] if agent == GPU else self.host_pools):
            r = cb(p, data)
            if r != OK:
                return r
        return OK

    def hsa_amd_memory_pool_get_info(self, pool, attr, out):
        flags = {COARSE: 4, KERNARG: 1 | 2, FINE: 2}[pool]
        vals = {0: 0, 1: flags, 2: 1 << 34, 5: True}
        if attr not in vals:
            return ERROR_INVALID_ARGUMENT
        out.contents.value = vals[attr]
        return OK

    def hsa_amd_memory_pool_allocate(self, pool, size, flags, out):
        out.contents.value = self._alloc(size, pool)
        return OK

    def hsa_amd_memory_pool_free(self, ptr):
        if int(ptr) not in self.allocs:
            return ERROR_INVALID_ARGUMENT
        del self.allocs[int(ptr)]
        return OK

    def hsa_amd_agents_allow_access(self, n, agents, flags, ptr):
        self.allowed.append(([agents[i] for i in range(n)], int(ptr)))
        return OK

    def hsa_memory_copy(self, dst, src, n):
        # like the GPU's copy engines: both sides must be memory the runtime knows
        if not (self.known(int(dst), n) and self.known(int(src), n)):
            return ERROR_INVALID_ARGUMENT
        ctypes.memmove(int(dst), int(src), n)
        return OK

    # ---- code objects ------------------------------------------------------------------
    def hsa_code_object_reader_create_from_memory(self, addr, size, out):
        data = ctypes.string_at(addr, size)
        if not data.startswith(b"FAKEHSACO"):
            return ERROR_INVALID_CODE_OBJECT
        h = self._handle()
        self._readers[h] = json.loads(data[len(b"FAKEHSACO"):])
        out.contents.value = h
        return OK

    def hsa_code_object_reader_destroy(self, reader):
        return OK

    def hsa_executable_create_alt(self, profile, rounding, options, out):
        h = self._handle()
        self._exes[h] = {"symbols": {}, "frozen": False}
        out.contents.value = h
        return OK

    def hsa_executable_load_agent_code_object(self, exe, agent, reader, options, out):
        co = self._readers[reader]
        if agent != GPU or co["arch"] != self.arch:
            return ERROR_INVALID_CODE_OBJECT
        for name, info in co["kernels"].items():
            ko = self._handle() * 0x1000
            sym = {"name": name, "kernel_object": ko,
                   "kernarg_size": info.get("kernarg_size", 64),
                   "kernarg_align": info.get("kernarg_align", 16),
                   "group_size": info.get("group_size", 0),
                   "private_size": info.get("private_size", 0)}
            self._objects[ko] = sym
            self._exes[exe]["symbols"][name + ".kd"] = sym
        out.contents.value = self._handle()
        return OK

    def hsa_executable_freeze(self, exe, options):
        self._exes[exe]["frozen"] = True
        return OK

    def hsa_executable_destroy(self, exe):
        return OK

    def hsa_executable_get_symbol_by_name(self, exe, name, agent, out):
        e = self._exes[exe]
        sym = e["symbols"].get(name.decode())
        if sym is None or not e["frozen"]:
            return ERROR_INVALID_SYMBOL_NAME
        out.contents.value = sym["kernel_object"]       # the symbol handle: same number
        return OK

    def hsa_executable_symbol_get_info(self, sym, attr, out):
        s = self._objects[sym]
        key = {22: "kernel_object", 11: "kernarg_size", 12: "kernarg_align",
               13: "group_size", 14: "private_size"}.get(attr)
        if key is None:
            return ERROR_INVALID_ARGUMENT
        out.contents.value = s[key]
        return OK

    # ---- signals -----------------------------------------------------------------------
    def hsa_signal_create(self, value, n, consumers, out):
        h = self._handle()
        self.signals[h] = int(value)
        out.contents.value = h
        return OK

    def hsa_signal_destroy(self, s):
        self.signals.pop(s)
        return OK

    def hsa_signal_store_screlease(self, s, value):
        if self.queue is not None and s == self.queue["doorbell"]:
            self.log.append(("doorbell", int(value)))
            self.signals[s] = int(value)
            if self.process:
                self._run(int(value))
            return
        self.signals[s] = int(value)

    def hsa_signal_load_scacquire(self, s):
        return self.signals[s]

    def hsa_signal_add_scacq_screl(self, s, value):
        self.log.append(("add", s, int(value)))
        self.signals[s] += int(value)

    def hsa_signal_wait_scacquire(self, s, cond, value, timeout, state):
        return self.signals[s]           # returns at once: the caller loops to its deadline

    # ---- queues ------------------------------------------------------------------------
    def hsa_queue_create(self, agent, size, qtype, cb, data, priv, group, out):
        if agent != GPU or size & (size - 1):
            return ERROR_INVALID_ARGUMENT
        base = self._alloc(size * 64, None)
        for i in range(size):                            # every slot starts INVALID
            ctypes.c_uint16.from_address(base + 64 * i).value = aql.PACKET_TYPE_INVALID
        from poot.backends.rocm.hsa import hsa_queue_t

        qs = hsa_queue_t(type=qtype, features=1, base_address=base,
                         doorbell_signal=self._handle(), size=size, id=1)
        self.signals[qs.doorbell_signal] = -1
        self.queue = {"struct": qs, "base": base, "size": size, "read": 0, "write": 0,
                      "doorbell": qs.doorbell_signal, "callback": cb}
        out.contents.value = ctypes.addressof(qs)
        return OK

    def hsa_queue_destroy(self, q):
        return OK

    def hsa_queue_add_write_index_scacq_screl(self, q, n):
        old = self.queue["write"]
        self.queue["write"] += int(n)
        return old

    def hsa_queue_load_read_index_scacquire(self, q):
        return self.queue["read"]

    # ---- the packet processor ----------------------------------------------------------
    def raise_queue_error(self, status=ERROR_EXCEPTION) -> None:
        """Report a queue error through the queue's callback, as ROCr does."""
        q = self.queue
        q["callback"](status, ctypes.addressof(q["struct"]), None)

    def slot(self, index: int) -> bytes:
        """The 64 bytes of ring slot ``index`` (modulo the queue size)."""
        q = self.queue
        return ctypes.string_at(q["base"] + 64 * (index % q["size"]), 64)

    def _run(self, last: int) -> None:
        q = self.queue
        while q["read"] <= last:
            addr = q["base"] + 64 * (q["read"] % q["size"])
            raw = ctypes.string_at(addr, 64)
            kind = raw[0]
            if kind == aql.PACKET_TYPE_INVALID:
                self.violations.append(f"doorbell {last} rung but slot {q['read']} holds no "
                                       f"published packet")
                return
            self.processed.append(raw)
            if kind == aql.PACKET_TYPE_KERNEL_DISPATCH:
                d = aql.decode_dispatch(raw)
                sym = self._objects[d["kernel_object"]]
                n = sym.get("nargs", None)
                fn = self.kernels[sym["name"]]
                nargs = getattr(fn, "nargs", 0) if n is None else n
                args = list(struct.unpack_from(f"<{nargs}Q",
                                               ctypes.string_at(d["kernarg_address"], 8 * nargs)))
                fn(self, args, d)
                sig = d["completion_signal"]
            else:
                sig = struct.unpack_from("<Q", raw, 56)[0]
            if sig:
                self.signals[sig] -= 1
            ctypes.c_uint16.from_address(addr).value = aql.PACKET_TYPE_INVALID
            q["read"] += 1


def kernel(nargs: int):
    """Mark a fake kernel function with its number of pointer arguments."""
    def wrap(fn):
        fn.nargs = nargs
        return fn
    return wrap


def f32(address: int, n: int):
    """A float32 numpy view of ``n`` elements at ``address``."""
    import numpy as np

    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address))
