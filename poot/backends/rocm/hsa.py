"""ctypes bindings to the HSA runtime (ROCr, ``libhsa-runtime64.so.1``): only the calls the
ROCm device (:mod:`poot.backends.rocm.runtime`) uses. Imports no MLIR; the library is loaded
at run time (:func:`library`), never at import.

Sources: the HSA Runtime Programmer's Reference Manual 1.2 (``hsa.h``: agents, signals,
queues, code object readers, executables) and ROCr's AMD extension (``hsa_ext_amd.h``:
memory pools, ``hsa_amd_agents_allow_access``, ``HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES``).
Enumerator values below are those headers' values.

Handles (``hsa_agent_t``, ``hsa_signal_t``, ``hsa_amd_memory_pool_t``, ``hsa_executable_t``,
...) are C structs of one ``uint64_t``; they are passed here as ``c_uint64``: on x86-64
(System V) and AArch64 (AAPCS64) a struct of one 8-byte integer is passed and returned
exactly like that integer, in a general register.

Every call's ``hsa_status_t`` is checked: a failure raises :class:`HsaError` naming the call
and ``hsa_status_string``'s message. A missing library raises :class:`NoRocmRuntime`. Both
are :class:`poot.backends.cpu.runtime.DeviceError`.

Tests inject a stand-in library with :func:`use_library` (an object whose attributes are the
``hsa_*`` functions, called with the same arguments as the real ones: ints, ``ctypes``
pointers for out-parameters, ``CFUNCTYPE`` callbacks) and, optionally, the
:class:`MemoryOps` that write queue slots (so a fake can observe the order of stores).
"""

from __future__ import annotations

import ctypes
import time

from poot.runtime.device import DeviceError

LIBRARY = "libhsa-runtime64.so.1"

# hsa_status_t
STATUS_SUCCESS = 0x0
STATUS_INFO_BREAK = 0x1
STATUS_ERROR = 0x1000

# hsa_system_info_t
SYSTEM_INFO_TIMESTAMP_FREQUENCY = 3          # uint64_t, Hz

# hsa_agent_info_t
AGENT_INFO_NAME = 0                          # char[64], "gfx942"
AGENT_INFO_WAVEFRONT_SIZE = 6                # uint32_t
AGENT_INFO_QUEUE_MAX_SIZE = 14               # uint32_t, packets
AGENT_INFO_DEVICE = 17                       # hsa_device_type_t (uint32_t)
DEVICE_TYPE_CPU = 0
DEVICE_TYPE_GPU = 1
# hsa_amd_agent_info_t: uint8_t[8] flag bits; HSA_AMD_MEMORY_PROPERTY_AGENT_IS_APU (= 1 << 0)
# is a BIT INDEX for hsa_flag_isset64 (ROCr sets bit 1 of byte 0 for an integrated GPU)
AMD_AGENT_INFO_MEMORY_PROPERTIES = 0xA114
AMD_MEMORY_PROPERTY_AGENT_IS_APU = 1 << 0

# hsa_amd_memory_pool_info_t, hsa_amd_segment_t, hsa_amd_memory_pool_global_flag_t
AMD_MEMORY_POOL_INFO_SEGMENT = 0             # uint32_t
AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS = 1        # uint32_t
AMD_MEMORY_POOL_INFO_SIZE = 2                # size_t
AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED = 5   # bool
AMD_SEGMENT_GLOBAL = 0
AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT = 1
AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED = 2
AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED = 4

# hsa_executable_symbol_info_t
SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE = 11     # uint32_t
SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT = 12  # uint32_t
SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE = 13       # uint32_t
SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE = 14     # uint32_t
SYMBOL_INFO_KERNEL_OBJECT = 22                   # uint64_t

PROFILE_FULL = 1
DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT = 0
QUEUE_TYPE_SINGLE = 1
SIGNAL_CONDITION_EQ = 0
WAIT_STATE_BLOCKED = 0


class hsa_queue_t(ctypes.Structure):  # noqa: N801
    """``hsa_queue_t`` (HSA runtime spec 1.2, large model): type u32 @0, features u32 @4,
    base_address void* @8 (the ring of ``size`` 64-byte packets), doorbell_signal u64 @16,
    size u32 @24 (packets, a power of two), reserved1 u32 @28, id u64 @32."""

    _fields_ = [("type", ctypes.c_uint32), ("features", ctypes.c_uint32),
                ("base_address", ctypes.c_uint64), ("doorbell_signal", ctypes.c_uint64),
                ("size", ctypes.c_uint32), ("reserved1", ctypes.c_uint32),
                ("id", ctypes.c_uint64)]


assert ctypes.sizeof(hsa_queue_t) == 40

#: ``hsa_status_t (*)(hsa_agent_t, void*)`` (hsa_iterate_agents)
AGENT_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p)
#: ``hsa_status_t (*)(hsa_amd_memory_pool_t, void*)`` (hsa_amd_agent_iterate_memory_pools)
POOL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p)
#: ``void (*)(hsa_status_t, hsa_queue_t*, void*)`` (hsa_queue_create's error callback)
QUEUE_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p)

_u32, _u64, _i64, _vp, _sz = (ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64,
                              ctypes.c_void_p, ctypes.c_size_t)
_P = ctypes.POINTER
#: restype, argtypes of every function used (set on the real library when it is loaded)
SIGNATURES = {
    "hsa_init": (_u32, []),
    "hsa_shut_down": (_u32, []),
    "hsa_status_string": (_u32, [_u32, _P(ctypes.c_char_p)]),
    "hsa_system_get_info": (_u32, [_u32, _vp]),
    "hsa_iterate_agents": (_u32, [AGENT_CALLBACK, _vp]),
    "hsa_agent_get_info": (_u32, [_u64, _u32, _vp]),
    "hsa_amd_agent_iterate_memory_pools": (_u32, [_u64, POOL_CALLBACK, _vp]),
    "hsa_amd_memory_pool_get_info": (_u32, [_u64, _u32, _vp]),
    "hsa_amd_memory_pool_allocate": (_u32, [_u64, _sz, _u32, _P(_vp)]),
    "hsa_amd_memory_pool_free": (_u32, [_vp]),
    "hsa_amd_agents_allow_access": (_u32, [_u32, _P(_u64), _P(_u32), _vp]),
    "hsa_memory_copy": (_u32, [_vp, _vp, _sz]),
    "hsa_code_object_reader_create_from_memory": (_u32, [_vp, _sz, _P(_u64)]),
    "hsa_code_object_reader_destroy": (_u32, [_u64]),
    "hsa_executable_create_alt": (_u32, [_u32, _u32, ctypes.c_char_p, _P(_u64)]),
    "hsa_executable_load_agent_code_object": (_u32, [_u64, _u64, _u64, ctypes.c_char_p,
                                                     _P(_u64)]),
    "hsa_executable_freeze": (_u32, [_u64, ctypes.c_char_p]),
    "hsa_executable_destroy": (_u32, [_u64]),
    "hsa_executable_get_symbol_by_name": (_u32, [_u64, ctypes.c_char_p, _P(_u64), _P(_u64)]),
    "hsa_executable_symbol_get_info": (_u32, [_u64, _u32, _vp]),
    "hsa_signal_create": (_u32, [_i64, _u32, _P(_u64), _P(_u64)]),
    "hsa_signal_destroy": (_u32, [_u64]),
    "hsa_signal_store_screlease": (None, [_u64, _i64]),
    "hsa_signal_load_scacquire": (_i64, [_u64]),
    "hsa_signal_add_scacq_screl": (None, [_u64, _i64]),
    "hsa_signal_wait_scacquire": (_i64, [_u64, _u32, _i64, _u64, _u32]),
    "hsa_queue_create": (_u32, [_u64, _u32, _u32, QUEUE_CALLBACK, _vp, _u32, _u32, _P(_vp)]),
    "hsa_queue_destroy": (_u32, [_vp]),
    "hsa_queue_add_write_index_scacq_screl": (_u64, [_vp, _u64]),
    "hsa_queue_load_read_index_scacquire": (_u64, [_vp]),
}


class HsaError(DeviceError):
    """An HSA call failed: ``call`` is the function, ``status`` its ``hsa_status_t``; the
    message names both and gives ``hsa_status_string``'s text."""

    def __init__(self, call: str, status: int, message: str):
        self.call, self.status = call, status
        super().__init__(f"{call} failed: {message} (hsa_status_t {status:#x})")


class NoRocmRuntime(DeviceError):
    """The HSA runtime library is not installed here."""


class HsaTimeout(DeviceError):
    """A bounded wait on the device ran out (the message says what was waited for)."""


NO_RUNTIME = f"no ROCm runtime ({LIBRARY} not found)"

_override: tuple | None = None


def use_library(lib, memory: "MemoryOps | None" = None) -> None:
    """Make :func:`library` return ``lib`` (a stand-in HSA library for tests) and queue-slot
    stores go through ``memory``; ``use_library(None)`` restores the real loader."""
    global _override
    _override = None if lib is None else (lib, memory)


def library():
    """``(lib, memory_ops)``: the injected library, else ``ctypes.CDLL(libhsa-runtime64.so.1)``
    with every used function's restype/argtypes set (:data:`SIGNATURES`) and the real
    :class:`MemoryOps`. Raises :class:`NoRocmRuntime` when the library cannot be loaded."""
    if _override is not None:
        return _override[0], _override[1] or MemoryOps()
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as e:
        raise NoRocmRuntime(f"{NO_RUNTIME}: {e}") from None
    for name, (res, args) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise NoRocmRuntime(f"{LIBRARY} has no {name} (a ROCm runtime too old for "
                                f"poot)") from None
        fn.restype, fn.argtypes = res, args
    return lib, MemoryOps()


def runtime_available() -> tuple[bool, str]:
    """(True, LIBRARY) when the HSA runtime library loads, else (False, why). Initializes
    nothing."""
    try:
        library()
    except NoRocmRuntime as e:
        return False, str(e)
    return True, LIBRARY


class MemoryOps:
    """How the host writes queue slots (the real ones; a fake may record them instead).

    * :meth:`write` — plain stores of the packet body (``ctypes.memmove``).
    * :meth:`store_release_u32` — the packet's 32-bit header word, one aligned 4-byte store
      (``ctypes.c_uint32.from_address(addr).value``). On x86-64 (the hosts AMD GPUs run on)
      every store has release semantics (TSO: a store is never reordered with earlier
      stores), so this single aligned store is the release store the AQL protocol needs for
      a ring in ordinary write-back system memory. Other host architectures are refused by
      :func:`host_supports_release_store`.
    * the store FENCE (:meth:`Hsa.store_fence`) is an HSA atomic read-modify-write, see
      there: Python has no fence primitive of its own.
    """

    def write(self, address: int, data: bytes) -> None:
        """Copy ``data`` to ``address`` (plain stores)."""
        ctypes.memmove(address, data, len(data))

    def store_release_u32(self, address: int, value: int) -> None:
        """One aligned 32-bit store of ``value`` at ``address`` (release on x86-64 TSO)."""
        ctypes.c_uint32.from_address(address).value = value

    def read(self, address: int, nbytes: int) -> bytes:
        """``nbytes`` at ``address``."""
        return ctypes.string_at(address, nbytes)


def host_supports_release_store() -> bool:
    """True on x86-64 hosts, whose plain aligned stores are release stores (TSO)."""
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")


class Hsa:
    """The HSA calls the ROCm device needs, each checked. ``lib``/``memory`` as returned by
    :func:`library` (default: loaded now). Construction calls ``hsa_init``."""

    def __init__(self, lib=None, memory: MemoryOps | None = None):
        if lib is None:
            lib, memory = library()
        self.lib = lib
        self.memory = memory or MemoryOps()
        self._keep: list = []           # callbacks that must outlive the calls they went to
        self._fence_signal = None
        self.call("hsa_init")
        self._freq = None

    # ---- plumbing ----------------------------------------------------------------------
    def status_string(self, status: int) -> str:
        """``hsa_status_string``'s text for ``status`` (or a placeholder if it has none)."""
        s = ctypes.c_char_p()
        try:
            if self.lib.hsa_status_string(status, ctypes.pointer(s)) == 0 and s.value:
                return s.value.decode(errors="replace")
        except Exception:  # noqa: BLE001  (a broken runtime: still name the call)
            pass
        return f"unknown HSA status {status:#x}"

    def call(self, name: str, *args, ok=(STATUS_SUCCESS,)) -> int:
        """Call ``name`` and check its ``hsa_status_t``: anything but ``ok`` raises
        :class:`HsaError` naming the call and the status text."""
        status = int(getattr(self.lib, name)(*args))
        if status not in ok:
            raise HsaError(name, status, self.status_string(status))
        return status

    def shut_down(self) -> None:
        """``hsa_shut_down`` (one per ``hsa_init``)."""
        self.call("hsa_shut_down")

    def timestamp_frequency(self) -> int:
        """``HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY`` in Hz (the unit of wait timeout hints)."""
        if self._freq is None:
            v = _u64()
            self.call("hsa_system_get_info", SYSTEM_INFO_TIMESTAMP_FREQUENCY, ctypes.pointer(v))
            self._freq = int(v.value) or 1_000_000_000
        return self._freq

    # ---- agents and pools --------------------------------------------------------------
    def agents(self) -> list[int]:
        """Every agent handle, in ``hsa_iterate_agents`` order."""
        out: list[int] = []

        def cb(agent, data):
            out.append(int(agent))
            return STATUS_SUCCESS
        fn = AGENT_CALLBACK(cb)
        self.call("hsa_iterate_agents", fn, None)
        return out

    def _info(self, call: str, handle: int, attr: int, ctype):
        v = ctype()
        self.call(call, handle, attr, ctypes.pointer(v))
        return v

    def agent_device_type(self, agent: int) -> int:
        """``HSA_AGENT_INFO_DEVICE`` (``DEVICE_TYPE_CPU``/``GPU``/...)."""
        return int(self._info("hsa_agent_get_info", agent, AGENT_INFO_DEVICE, _u32).value)

    def agent_name(self, agent: int) -> str:
        """``HSA_AGENT_INFO_NAME``: for a GPU its ISA name, e.g. ``gfx942``."""
        v = self._info("hsa_agent_get_info", agent, AGENT_INFO_NAME, ctypes.c_char * 64)
        return v.value.decode(errors="replace")

    def agent_wavefront_size(self, agent: int) -> int:
        """``HSA_AGENT_INFO_WAVEFRONT_SIZE`` in work-items (32 or 64)."""
        return int(self._info("hsa_agent_get_info", agent, AGENT_INFO_WAVEFRONT_SIZE,
                              _u32).value)

    def agent_queue_max_size(self, agent: int) -> int:
        """``HSA_AGENT_INFO_QUEUE_MAX_SIZE`` in packets."""
        return int(self._info("hsa_agent_get_info", agent, AGENT_INFO_QUEUE_MAX_SIZE,
                              _u32).value)

    def agent_is_apu(self, agent: int) -> bool:
        """Whether ``agent`` is an integrated GPU: bit ``HSA_AMD_MEMORY_PROPERTY_AGENT_IS_APU``
        (bit index 1) of ``HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES`` (``uint8_t[8]``, read with
        ``hsa_flag_isset64`` semantics)."""
        v = self._info("hsa_agent_get_info", agent, AMD_AGENT_INFO_MEMORY_PROPERTIES,
                       ctypes.c_uint8 * 8)
        bit = AMD_MEMORY_PROPERTY_AGENT_IS_APU
        return bool((v[bit // 8] >> (bit % 8)) & 1)

    def pools(self, agent: int) -> list[int]:
        """The memory pool handles of ``agent`` (``hsa_amd_agent_iterate_memory_pools``)."""
        out: list[int] = []

        def cb(pool, data):
            out.append(int(pool))
            return STATUS_SUCCESS
        fn = POOL_CALLBACK(cb)
        self.call("hsa_amd_agent_iterate_memory_pools", agent, fn, None)
        return out

    def pool_info(self, pool: int) -> dict:
        """``segment``, ``flags`` (global flags; 0 outside the global segment), ``size``
        (bytes) and ``alloc`` (runtime allocation allowed) of ``pool``."""
        call = "hsa_amd_memory_pool_get_info"
        seg = int(self._info(call, pool, AMD_MEMORY_POOL_INFO_SEGMENT, _u32).value)
        flags = int(self._info(call, pool, AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, _u32).value) \
            if seg == AMD_SEGMENT_GLOBAL else 0
        size = int(self._info(call, pool, AMD_MEMORY_POOL_INFO_SIZE, _sz).value)
        alloc = bool(self._info(call, pool, AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED,
                                ctypes.c_bool).value)
        return {"segment": seg, "flags": flags, "size": size, "alloc": alloc}

    # ---- memory ------------------------------------------------------------------------
    def pool_allocate(self, pool: int, nbytes: int) -> int:
        """``hsa_amd_memory_pool_allocate`` of ``nbytes``; the address."""
        p = _vp()
        self.call("hsa_amd_memory_pool_allocate", pool, int(nbytes), 0, ctypes.pointer(p))
        if not p.value:
            raise HsaError("hsa_amd_memory_pool_allocate", STATUS_ERROR,
                           f"returned a null pointer for {nbytes} bytes")
        return int(p.value)

    def pool_free(self, address: int) -> None:
        """``hsa_amd_memory_pool_free``."""
        self.call("hsa_amd_memory_pool_free", address)

    def allow_access(self, agents: list[int], address: int) -> None:
        """``hsa_amd_agents_allow_access``: ``agents`` may access the allocation at
        ``address``."""
        arr = (_u64 * len(agents))(*agents)
        self.call("hsa_amd_agents_allow_access", len(agents), arr, None, address)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """``hsa_memory_copy`` (synchronous; both addresses known to the runtime)."""
        self.call("hsa_memory_copy", dst, src, int(nbytes))

    # ---- code objects ------------------------------------------------------------------
    def load_code_object(self, agent: int, code: bytes) -> tuple[int, int]:
        """Load an HSACO for ``agent``: reader from memory, executable (full profile, default
        rounding), load, freeze. Returns ``(executable, reader)``."""
        buf = ctypes.create_string_buffer(code, len(code))
        reader, exe, loaded = _u64(), _u64(), _u64()
        self.call("hsa_code_object_reader_create_from_memory", ctypes.addressof(buf),
                  len(code), ctypes.pointer(reader))
        self._keep.append(buf)
        self.call("hsa_executable_create_alt", PROFILE_FULL,
                  DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT, None, ctypes.pointer(exe))
        self.call("hsa_executable_load_agent_code_object", exe.value, agent, reader.value,
                  None, ctypes.pointer(loaded))
        self.call("hsa_executable_freeze", exe.value, None)
        return int(exe.value), int(reader.value)

    def kernel_symbol(self, executable: int, agent: int, name: str) -> dict:
        """The kernel ``name`` of ``executable`` (symbol ``name.kd``): ``kernel_object``,
        ``kernarg_size``/``kernarg_align``, ``group_size``, ``private_size`` (bytes)."""
        sym = _u64()
        ag = _u64(agent)
        self.call("hsa_executable_get_symbol_by_name", executable, f"{name}.kd".encode(),
                  ctypes.pointer(ag), ctypes.pointer(sym))
        call = "hsa_executable_symbol_get_info"
        s = sym.value
        return {"kernel_object": int(self._info(call, s, SYMBOL_INFO_KERNEL_OBJECT, _u64).value),
                "kernarg_size": int(self._info(call, s, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE,
                                               _u32).value),
                "kernarg_align": int(self._info(
                    call, s, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT, _u32).value),
                "group_size": int(self._info(call, s, SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE,
                                             _u32).value),
                "private_size": int(self._info(call, s, SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE,
                                               _u32).value)}

    # ---- signals -----------------------------------------------------------------------
    def signal_create(self, value: int) -> int:
        """``hsa_signal_create`` with ``value``, any consumer; the handle."""
        s = _u64()
        self.call("hsa_signal_create", int(value), 0, None, ctypes.pointer(s))
        return int(s.value)

    def signal_destroy(self, signal: int) -> None:
        """``hsa_signal_destroy``."""
        self.call("hsa_signal_destroy", signal)

    def signal_store(self, signal: int, value: int) -> None:
        """``hsa_signal_store_screlease`` (the doorbell is rung this way)."""
        self.lib.hsa_signal_store_screlease(signal, int(value))

    def signal_load(self, signal: int) -> int:
        """``hsa_signal_load_scacquire``."""
        return int(self.lib.hsa_signal_load_scacquire(signal))

    def signal_add(self, signal: int, value: int) -> None:
        """``hsa_signal_add_scacq_screl`` (an atomic read-modify-write)."""
        self.lib.hsa_signal_add_scacq_screl(signal, int(value))

    def signal_wait_eq(self, signal: int, value: int, timeout_s: float, what: str) -> None:
        """Wait until ``signal`` reads ``value``, at most ``timeout_s`` seconds
        (``hsa_signal_wait_scacquire`` with a timeout hint in timestamp ticks, repeated: the
        hint may return early). Raises :class:`HsaTimeout` naming ``what``."""
        deadline = time.monotonic() + timeout_s
        freq = self.timestamp_frequency()
        while True:
            left = deadline - time.monotonic()
            hint = int(max(0.0, min(left, 0.01)) * freq)
            got = int(self.lib.hsa_signal_wait_scacquire(signal, SIGNAL_CONDITION_EQ,
                                                         int(value), hint,
                                                         WAIT_STATE_BLOCKED))
            if got == value:
                return
            if time.monotonic() >= deadline:
                raise HsaTimeout(f"timed out after {timeout_s:g} s waiting for {what} "
                                 f"(signal reads {got}, expected {value})")

    def store_fence(self) -> None:
        """A host store fence (the x86 ``sfence`` equivalent), from Python.

        Python and ctypes have no fence. This does an atomic read-modify-write (add 0) on a
        private HSA signal, ``hsa_signal_add_scacq_screl``: ROCr implements it as a
        ``LOCK``-prefixed instruction on the signal's host-memory value, and on x86-64 a
        locked instruction orders every earlier store and drains the write-combining buffers
        (Intel SDM Vol. 3, 9.1.2.2 / 11.3.1), as ``sfence`` does. Used before ringing the
        doorbell when the queue ring is write-combined device memory."""
        if self._fence_signal is None:
            self._fence_signal = self.signal_create(0)
        self.lib.hsa_signal_add_scacq_screl(self._fence_signal, 0)

    # ---- queues ------------------------------------------------------------------------
    def queue_create(self, agent: int, size: int, on_error) -> int:
        """``hsa_queue_create``: a single-producer queue of ``size`` packets on ``agent``;
        ``on_error(status, message)`` is called (from a runtime thread) on a queue error.
        Returns the ``hsa_queue_t*`` address."""
        def cb(status, queue, data):
            on_error(int(status), self.status_string(int(status)))
        fn = QUEUE_CALLBACK(cb)
        self._keep.append(fn)
        q = _vp()
        self.call("hsa_queue_create", agent, int(size), QUEUE_TYPE_SINGLE, fn, None,
                  0xFFFFFFFF, 0xFFFFFFFF, ctypes.pointer(q))
        return int(q.value)

    @staticmethod
    def queue_struct(queue: int) -> hsa_queue_t:
        """The ``hsa_queue_t`` at ``queue`` (base_address, doorbell_signal, size, ...)."""
        return hsa_queue_t.from_address(queue)

    def queue_destroy(self, queue: int) -> None:
        """``hsa_queue_destroy``."""
        self.call("hsa_queue_destroy", queue)

    def queue_add_write_index(self, queue: int, n: int) -> int:
        """``hsa_queue_add_write_index_scacq_screl``: reserve ``n`` slots; the old index."""
        return int(self.lib.hsa_queue_add_write_index_scacq_screl(queue, int(n)))

    def queue_load_read_index(self, queue: int) -> int:
        """``hsa_queue_load_read_index_scacquire``."""
        return int(self.lib.hsa_queue_load_read_index_scacquire(queue))


__all__ = ["Hsa", "HsaError", "HsaTimeout", "LIBRARY", "MemoryOps", "NO_RUNTIME",
           "NoRocmRuntime", "hsa_queue_t", "host_supports_release_store", "library",
           "runtime_available", "use_library"]
