"""The Vulkan device: the executor's Device protocol on the PyPI ``vulkan`` package (cffi).

Imports no MLIR: a compiled :class:`~poot.backends.vulkan.artifact.VulkanArtifact` (SPIR-V +
plan JSON) is all it reads, so it runs on a machine without the compiler.

    dev = VulkanDevice()                          # best device: discrete > integrated > cpu
    engine = Session(dev)                          # poot.runtime.session.Session
    kernel = dev.load(program_or_artifact_or_dir)
    rec = dev.record(kernel, buffers)             # descriptor sets + ONE command buffer
    dev.replay(rec); dev.synchronize()            # resubmitted verbatim, bounded fence wait

Semantics (what the Vulkan backend guarantees):

* **robustBufferAccess is required**: SPIR-V has no trap, so an out-of-bounds access must stay
  harmless; a device without it is refused at open (:class:`RobustnessUnavailable`).
* **record once, resubmit verbatim**: :meth:`record` writes one descriptor set per dispatch
  and records one primary command buffer: the dispatches, with a memory barrier in front of
  a step only where it touches a buffer (other than weights and constant tables, which are
  only read) that a step since the last barrier touched -- compute to compute between two
  dispatches -- then a full barrier and one to the host; :meth:`replay` is one
  ``vkQueueSubmit`` of that command buffer through ``vk.lib``, with the recording's prebuilt
  ``VkSubmitInfo`` when no transfer goes with it.
* **bounded waits, poisoning**: :meth:`synchronize` waits on each submission's fence at most
  ``fence_timeout_s`` (600 s by default). A timed-out wait or a failed submission poisons the
  device: it raises :class:`DeviceLost`, leaks whatever the pending work may still reference
  (nothing is destroyed), and every later call raises :class:`DeviceLost` again.
* **error word**: one 8-byte host-visible buffer is bound to every pipeline as its last
  binding; kernel checks write a code (word 0) and the kernel index + 1 (word 1).
  every wait reads it after a fence and raises :class:`KernelFault` (then clears it), so a
  fault in a pipelined step surfaces at the next readback or :meth:`synchronize`.
* **memory**: one allocation per buffer. If the device has a large host-visible device-local
  heap (UMA, lavapipe, resizable BAR) every buffer lives there, mapped once; otherwise buffers
  of at least ``staging_threshold`` bytes are device-local and uploads/downloads go through a
  staging buffer, smaller ones (slot buffers, sampled tokens) stay host-visible
  (``unified_memory=False`` forces that split on any device).
* **recorded copies**: ``record(kernel, buffers, copies=[(src, dst)])`` appends whole-buffer
  copies after the last dispatch (e.g. the sampled token into the next step's token input).
* **queued work, several submissions in flight** (``overlaps`` is True): :meth:`replay`
  submits and returns, each submission with a fence of its own. :meth:`upload_async` writes
  its bytes into a transfer command buffer (``vkCmdUpdateBuffer``: copied at once, at most
  64 KiB, which every per-step input of a decode step is) and :meth:`download_async` copies
  the buffer into a host-visible readback slot there; that command buffer goes out in front
  of the next replay (in the same ``vkQueueSubmit``), or alone when it holds a read and
  anything else is queued or the read is waited for, so "write the inputs, replay, read the
  outputs" of step n+1 is issued while step n runs, in queue order, and waiting for step n's
  read never waits for step n+1. The plain :meth:`upload`, :meth:`download` and larger async writes
  wait for every submission first. Queue order plus the barriers that end each recording
  (and each transfer command buffer) order every submission after the ones before it.
* **live memory**: :meth:`memory_budget` reads ``VK_EXT_memory_budget`` when the device has it
  (enabled at open), else returns None.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from poot.backends.gpu.artifact import check_bindings, check_copies
from poot.errors import PootError
from poot.runtime.device import DeviceError, Ready, row_regions
from poot import settings

if __package__:
    from poot.backends.vulkan.artifact import ERROR_NAMES, BufferSpec, VulkanArtifact
else:                     # loaded as a file beside artifact.py (check.py on a machine w/o MLIR)
    from artifact import ERROR_NAMES, BufferSpec, VulkanArtifact  # type: ignore  # noqa

DEFAULT_FENCE_TIMEOUT_S = 600.0
#: the largest write ``vkCmdUpdateBuffer`` takes (bytes); larger async uploads wait instead
MAX_INLINE_UPLOAD = 65536
#: submissions in flight before :meth:`VulkanDevice.replay` waits for the oldest
MAX_IN_FLIGHT = 64


class VulkanError(PootError):
    """A Vulkan runtime failure."""


class VulkanUnavailable(VulkanError):
    """No Vulkan loader, no instance, or no usable compute device."""


class RobustnessUnavailable(VulkanError):
    """The device lacks ``robustBufferAccess``; poot refuses to open it (SPIR-V has no trap,
    so an out-of-bounds access must be made harmless by the device)."""


class DeviceLost(VulkanError):
    """A fence wait timed out or a submission failed: the device is poisoned and refuses
    every later call."""


class KernelFault(VulkanError):
    """A kernel check set the error word.

    Attributes: code (the error code), dispatch (the dispatch region's name, when known)."""

    def __init__(self, code: int, dispatch: str | None):
        self.code, self.dispatch = code, dispatch
        what = ERROR_NAMES.get(code, f"error code {code}")
        super().__init__(f"kernel fault: {what}" + (f" in {dispatch}" if dispatch else ""))


#: what to install when the Vulkan loader or every driver (ICD) is missing
INSTALL_HINT = "Debian/Ubuntu: apt-get install libvulkan1 mesa-vulkan-drivers"


def _vk():
    try:
        import vulkan as vk
    except OSError:                       # the package opens libvulkan.so.1 at import
        raise VulkanUnavailable(f"the Vulkan loader (libvulkan.so.1) is not installed "
                                f"({INSTALL_HINT})") from None
    except ImportError as e:
        raise VulkanUnavailable(f"the 'vulkan' package does not import ({e}): pip install "
                                f"'poot[vulkan]'") from None
    return vk


_NP = {"f32": np.float32, "f16": np.uint16, "bf16": np.uint16, "i64": np.int64,
       "i32": np.int32, "i8": np.int8, "i1": np.bool_, "u8": np.uint8}

FEATURE_NAMES_10 = ("robustBufferAccess", "shaderInt64", "shaderInt16", "shaderFloat64")


def host_layout(t) -> tuple[np.dtype, tuple, int]:
    """(numpy dtype, shape, nbytes) of a buffer of ``t`` (a BufferSpec, or a poot
    TensorType/PackedType: read by duck typing, no import): bf16/f16 as uint16 words, i1 as
    bool bytes, packed weights as their uint8 bytes."""
    if isinstance(t, BufferSpec):
        return np.dtype(_NP[t.dtype]), tuple(t.shape), int(t.nbytes)
    if hasattr(t, "format"):                 # PackedType
        return np.dtype(np.uint8), (int(t.nbytes),), int(t.nbytes)
    return np.dtype(_NP[t.dtype.value]), tuple(t.shape), int(t.nbytes)


def buffer_bytes(array, dtype: np.dtype, error: type[Exception]) -> np.ndarray:
    """``array``'s bytes (uint8, flat) as a buffer of host ``dtype`` holds them: 16-bit
    floats (f16, bf16) by their bits, other dtypes cast within their kind; ``error`` (the
    runtime's own class) for a cast across kinds (floats into an int buffer)."""
    a = np.asarray(array)
    if a.dtype != dtype:
        if dtype == np.uint16 and a.dtype.itemsize == 2:
            a = a.view(np.uint16)
        elif not np.can_cast(a.dtype, dtype, "same_kind"):
            raise error(f"cannot write {a.dtype} data into a {dtype} buffer")
        a = a.astype(dtype)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@dataclass(frozen=True)
class VkKernelArg:
    """A loaded kernel's argument (the executor's KernelArg shape, without its import)."""

    role: str
    name: str
    type: BufferSpec


@dataclass(eq=False)
class VkBuffer:
    buffer: Any
    memory: Any
    nbytes: int           # logical bytes
    size: int             # allocated bytes (>= 4, multiple of 4)
    dtype: np.dtype
    shape: tuple
    host: np.ndarray | None = None    # mapped bytes (uint8) when host-visible


@dataclass(eq=False)
class VkLoadedKernel:
    """A loaded program: ``args`` (inputs, params, outputs), its pipelines and temps."""

    args: list
    artifact: VulkanArtifact
    pipelines: list
    set_layouts: list
    pipeline_layouts: list
    modules: list
    temps: dict = field(default_factory=dict)    # plan buffer id -> VkBuffer
    program: Any = None


@dataclass(eq=False)
class VkRecording:
    kernel: VkLoadedKernel
    command_buffer: Any
    pool: Any
    submit: Any           # prebuilt VkSubmitInfo*
    keep: list = field(default_factory=list)
    submits: int = 0
    query_pool: Any = None    # timestamps after each step (``record(timestamps=True)``)
    barriers: int = 0         # barriers between the plan's steps (hazards only)


@dataclass(eq=False)
class _Transfer:
    """Transfer commands queued between replays: one command buffer of inline uploads and
    copies into readback slots, submitted in front of the next replay (or alone)."""

    cb: Any
    touched: set = field(default_factory=set)   # id() of the buffers it writes or reads
    seq: int | None = None                      # the submission it went out with
    reads: int = 0                              # readback copies in it


@dataclass(eq=False)
class _Submission:
    seq: int
    fence: Any
    fence_arr: Any
    recording: VkRecording | None
    transfer: _Transfer | None
    keep: tuple = ()                            # cffi structs alive until the fence


class VkReadback:
    """A queued read of a device buffer into a host-visible slot (the executor's
    ``Readback``): :meth:`wait` waits for the submission that carries the copy (submitting
    it first if it is still queued) and returns a host copy; :meth:`release` gives the slot
    back once that submission has run."""

    def __init__(self, device: "VulkanDevice", transfer: _Transfer, slot: VkBuffer, dtype,
                 shape, nbytes: int):
        self.device, self.transfer, self.slot = device, transfer, slot
        self.dtype, self.shape, self.nbytes = dtype, shape, nbytes

    def wait(self) -> np.ndarray:
        if self.slot is None:
            raise VulkanError("this readback was already waited for or released")
        dev, slot = self.device, self.slot
        dev._check()
        if self.transfer.seq is None:
            dev._submit(None)
        dev._wait_through(self.transfer.seq)
        out = slot.host[:self.nbytes].view(self.dtype).reshape(self.shape).copy()
        self.slot = None
        dev._read_free.append(slot)
        return out

    def release(self) -> None:
        if self.slot is not None:
            self.device._read_spent.append((self.transfer, self.slot))
            self.slot = None


class VulkanDevice:
    """The executor Device for Vulkan (see the module doc)."""

    name = "vulkan"
    overlaps = True           # replays and queued transfers return before the GPU ran them

    def __init__(self, fence_timeout_s: float = DEFAULT_FENCE_TIMEOUT_S,
                 device: int | str | None = None, features_of=None,
                 staging_threshold: int = 1 << 16, app_name: str = "poot",
                 unified_memory: bool | None = None):
        vk = self.vk = _vk()
        self.ffi, self.lib = vk.ffi, vk.lib
        self.fence_timeout_s = float(fence_timeout_s)
        self.staging_threshold = int(staging_threshold)
        self._force_unified = unified_memory
        self._poisoned: str | None = None
        self._inflight: deque[_Submission] = deque()
        self._seq = 0                      # submissions made so far
        self._xfer: _Transfer | None = None
        self._free_fences: list = []
        self._free_xfer: list = []         # reset transfer command buffers
        self._read_free: list[VkBuffer] = []
        self._read_spent: list[tuple[_Transfer, VkBuffer]] = []   # released, maybe in use
        self._last_recording: VkRecording | None = None
        self._closed = False
        self.records = 0
        self.replays = 0
        self._buffers: list[VkBuffer] = []
        self._kernels: list[VkLoadedKernel] = []
        self._recordings: list[VkRecording] = []
        app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                   pApplicationName=app_name, applicationVersion=1,
                                   pEngineName="poot", engineVersion=1,
                                   apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
        try:
            self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app), None)
            pds = vk.vkEnumeratePhysicalDevices(self.instance)
        except vk.VkErrorIncompatibleDriver:
            raise VulkanUnavailable(f"the Vulkan loader found no driver (ICD) to create an "
                                    f"instance with (VkErrorIncompatibleDriver; "
                                    f"{INSTALL_HINT}, or set VK_DRIVER_FILES)") from None
        except vk.VkError as e:
            raise VulkanUnavailable(f"cannot create a Vulkan instance: {type(e).__name__}") \
                from None
        if not pds:
            raise VulkanUnavailable(f"no Vulkan physical device ({INSTALL_HINT})")
        self.physical = self._select(pds, device)
        self.properties = vk.vkGetPhysicalDeviceProperties(self.physical)
        self.device_name = self.ffi.string(self.properties.deviceName).decode() \
            if not isinstance(self.properties.deviceName, str) else self.properties.deviceName
        feats = (features_of or self._features)(self.physical)
        if not feats.get("robustBufferAccess"):
            raise RobustnessUnavailable(
                f"Vulkan device '{self.device_name}' lacks robustBufferAccess: poot requires it "
                "(SPIR-V has no trap; out-of-bounds accesses must stay harmless)")
        self.features = feats
        exts = {e.extensionName for e in
                vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        self.has_memory_budget = "VK_EXT_memory_budget" in exts
        self._open(feats, exts)

    # ---- opening -----------------------------------------------------------------------------
    def _select(self, pds, want):
        vk = self.vk
        want = want if want is not None else settings.get_str("POOT_VULKAN_DEVICE")
        rank = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0,
                vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
                vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2, vk.VK_PHYSICAL_DEVICE_TYPE_CPU: 3}
        props = [vk.vkGetPhysicalDeviceProperties(p) for p in pds]
        if want is not None and str(want).isdigit():
            i = int(want)
            if i >= len(pds):
                raise VulkanUnavailable(f"Vulkan device {i} requested, {len(pds)} present")
            return pds[i]
        if want:
            for p, pr in zip(pds, props):
                if str(want).lower() in str(pr.deviceName).lower():
                    return p
            raise VulkanUnavailable(f"no Vulkan device named like {want!r}")
        order = sorted(range(len(pds)), key=lambda i: rank.get(props[i].deviceType, 9))
        return pds[order[0]]

    def _features(self, pd) -> dict:
        """Feature bits poot cares about (core 1.0 + the 1.1/1.2 feature structs)."""
        vk, ffi, lib = self.vk, self.ffi, self.lib
        f = vk.vkGetPhysicalDeviceFeatures(pd)
        out = {n: bool(getattr(f, n)) for n in FEATURE_NAMES_10}
        if vk.VK_VERSION_MINOR(self.properties.apiVersion) >= 2 or \
                vk.VK_VERSION_MAJOR(self.properties.apiVersion) > 1:
            v12 = ffi.new("VkPhysicalDeviceVulkan12Features*")
            v12.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES
            v11 = ffi.new("VkPhysicalDeviceVulkan11Features*")
            v11.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES
            v11.pNext = v12
            f2 = ffi.new("VkPhysicalDeviceFeatures2*")
            f2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2
            f2.pNext = v11
            lib.vkGetPhysicalDeviceFeatures2(pd, f2)
            out["storageBuffer16BitAccess"] = bool(v11.storageBuffer16BitAccess)
            out["storageBuffer8BitAccess"] = bool(v12.storageBuffer8BitAccess)
            out["shaderFloat16"] = bool(v12.shaderFloat16)
            out["shaderInt8"] = bool(v12.shaderInt8)
        return out

    def _open(self, feats, exts):
        vk, ffi, lib = self.vk, self.ffi, self.lib
        qprops = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        fam = next((i for i, q in enumerate(qprops)
                    if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
        if fam is None:
            raise VulkanUnavailable(f"'{self.device_name}' has no compute queue")
        self.queue_family = fam
        base = ffi.new("VkPhysicalDeviceFeatures*")
        for n in FEATURE_NAMES_10:
            if n != "shaderFloat64" and feats.get(n):
                setattr(base, n, 1)
        chain = ffi.NULL
        keep = []
        if "storageBuffer8BitAccess" in feats:
            v12 = ffi.new("VkPhysicalDeviceVulkan12Features*")
            v12.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES
            v12.storageBuffer8BitAccess = int(feats["storageBuffer8BitAccess"])
            v12.shaderFloat16 = int(feats["shaderFloat16"])
            v12.shaderInt8 = int(feats["shaderInt8"])
            v11 = ffi.new("VkPhysicalDeviceVulkan11Features*")
            v11.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES
            v11.storageBuffer16BitAccess = int(feats["storageBuffer16BitAccess"])
            v11.pNext = v12
            chain = v11
            keep += [v11, v12]
        prio = ffi.new("float[1]", [1.0])
        qci = ffi.new("VkDeviceQueueCreateInfo*")
        qci.sType = vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO
        qci.queueFamilyIndex = fam
        qci.queueCount = 1
        qci.pQueuePriorities = prio
        ext_names = [ffi.new("char[]", b"VK_EXT_memory_budget")] if self.has_memory_budget \
            else []
        ext_arr = ffi.new("char*[]", ext_names) if ext_names else ffi.NULL
        dci = ffi.new("VkDeviceCreateInfo*")
        dci.sType = vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO
        dci.pNext = chain
        dci.queueCreateInfoCount = 1
        dci.pQueueCreateInfos = qci
        dci.pEnabledFeatures = base
        dci.enabledExtensionCount = len(ext_names)
        dci.ppEnabledExtensionNames = ext_arr
        dev = ffi.new("VkDevice*")
        r = lib.vkCreateDevice(self.physical, dci, ffi.NULL, dev)
        if r != vk.VK_SUCCESS:
            raise VulkanUnavailable(f"vkCreateDevice failed ({r}) on '{self.device_name}'")
        self.device = dev[0]
        self.queue = vk.vkGetDeviceQueue(self.device, fam, 0)
        self.cmd_pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=fam,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
        self._fence_arr = ffi.new("VkFence[1]", [self.fence])
        # memory types
        mp = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self._mem_types = [(mp.memoryTypes[i].propertyFlags, mp.memoryTypes[i].heapIndex)
                           for i in range(mp.memoryTypeCount)]
        self._heaps = [(mp.memoryHeaps[i].size, mp.memoryHeaps[i].flags)
                       for i in range(mp.memoryHeapCount)]
        HV, HC, DL = (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                      vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                      vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
        self._HV, self._HC, self._DL = HV, HC, DL
        big = [i for i, (fl, h) in enumerate(self._mem_types)
               if fl & (HV | HC | DL) == (HV | HC | DL) and self._heaps[h][0] >= (1 << 30)]
        self._unified = bool(big) or not any(
            fl & DL and not fl & HV for fl, _ in self._mem_types)
        if self._force_unified is not None:     # tests: exercise the staging path anywhere
            self._unified = bool(self._force_unified)
        self._staging: VkBuffer | None = None
        self._err = self._make_buffer(8, np.dtype(np.uint32), (2,), host=True)
        self._err.host[:] = 0

    # ---- state -------------------------------------------------------------------------------
    @property
    def poisoned(self) -> str | None:
        """Why the device is poisoned (None while healthy)."""
        return self._poisoned

    def _check(self):
        if self._poisoned:
            raise DeviceLost(f"Vulkan device '{self.device_name}' is poisoned: {self._poisoned}")
        if self._closed:
            raise VulkanError("the Vulkan device is closed")

    def _poison(self, why: str):
        self._poisoned = why
        # leak: the pending work may still reference buffers, sets and command buffers
        raise DeviceLost(f"Vulkan device '{self.device_name}' is poisoned: {why}")

    def capabilities(self) -> dict:
        """What codegen needs: feature names, subgroup size, limits (see
        :func:`poot.backends.vulkan.codegen.vulkan_target`)."""
        vk, ffi, lib = self.vk, self.ffi, self.lib
        sg = ffi.new("VkPhysicalDeviceSubgroupProperties*")
        sg.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES
        p2 = ffi.new("VkPhysicalDeviceProperties2*")
        p2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2
        p2.pNext = sg
        lib.vkGetPhysicalDeviceProperties2(self.physical, p2)
        lim = self.properties.limits
        feats = {k for k, v in self.features.items() if v}
        if sg.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT:
            for bit, name in ((vk.VK_SUBGROUP_FEATURE_BASIC_BIT, "subgroupBasic"),
                              (vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT, "subgroupShuffle"),
                              (vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT, "subgroupArithmetic")):
                if sg.supportedOperations & bit:
                    feats.add(name)
        return {"name": self.device_name, "device_type": int(self.properties.deviceType),
                "api_version": int(self.properties.apiVersion),
                "features": sorted(feats),
                "subgroup_size": int(sg.subgroupSize),
                "max_shared_bytes": int(lim.maxComputeSharedMemorySize),
                "max_storage_buffer_range": int(lim.maxStorageBufferRange),
                "max_workgroup_invocations": int(lim.maxComputeWorkGroupInvocations),
                "max_workgroup_count": [int(x) for x in lim.maxComputeWorkGroupCount],
                "memory_budget": self.has_memory_budget, "unified_memory": self._unified}

    def memory_budget(self) -> list[dict] | None:
        """Per heap ``{"budget", "usage", "size"}`` from VK_EXT_memory_budget; None when the
        device does not have the extension (lavapipe)."""
        self._check()
        if not self.has_memory_budget:
            return None
        vk, ffi, lib = self.vk, self.ffi, self.lib
        b = ffi.new("VkPhysicalDeviceMemoryBudgetPropertiesEXT*")
        b.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT
        m2 = ffi.new("VkPhysicalDeviceMemoryProperties2*")
        m2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2
        m2.pNext = b
        lib.vkGetPhysicalDeviceMemoryProperties2(self.physical, m2)
        return [{"budget": int(b.heapBudget[i]), "usage": int(b.heapUsage[i]),
                 "size": int(m2.memoryProperties.memoryHeaps[i].size)}
                for i in range(m2.memoryProperties.memoryHeapCount)]

    # ---- buffers -----------------------------------------------------------------------------
    def _mem_type(self, bits: int, want: int) -> int:
        for i, (fl, _) in enumerate(self._mem_types):
            if bits & (1 << i) and fl & want == want:
                return i
        raise VulkanError(f"no memory type with flags {want:#x}")

    def _make_buffer(self, nbytes: int, dtype, shape, host: bool) -> VkBuffer:
        vk = self.vk
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        buf = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size,
            usage=(vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                   | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT),
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(self.device, buf)
        if host:
            try:
                t = self._mem_type(req.memoryTypeBits, self._HV | self._HC | self._DL) \
                    if self._unified else self._mem_type(req.memoryTypeBits, self._HV | self._HC)
            except VulkanError:
                t = self._mem_type(req.memoryTypeBits, self._HV | self._HC)
        else:
            t = self._mem_type(req.memoryTypeBits, self._DL)
        mem = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
            memoryTypeIndex=t), None)
        vk.vkBindBufferMemory(self.device, buf, mem, 0)
        b = VkBuffer(buf, mem, int(nbytes), size, np.dtype(dtype), tuple(shape))
        if host:
            ptr = vk.vkMapMemory(self.device, mem, 0, size, 0)
            b.host = np.frombuffer(ptr, dtype=np.uint8, count=size)
            b.host[:] = 0
        self._buffers.append(b)
        return b

    def alloc(self, type_) -> VkBuffer:
        """A zero-filled buffer of ``type_`` (BufferSpec or poot type)."""
        self._check()
        dtype, shape, nbytes = host_layout(type_)
        host = self._unified or nbytes < self.staging_threshold
        b = self._make_buffer(nbytes, dtype, shape, host)
        if b.host is None:
            self._one_shot(lambda cb: self.vk.vkCmdFillBuffer(cb, b.buffer, 0, b.size, 0))
        return b

    def _staging_for(self, n: int) -> VkBuffer:
        if self._staging is None or self._staging.size < n:
            self._staging = self._make_buffer(max(n, 1 << 20), np.uint8, (n,), host=True)
        return self._staging

    def _one_shot(self, fill) -> None:
        """Record ``fill(cb)``, submit, wait (bounded): uploads/downloads of device-local
        buffers and fills."""
        vk = self.vk
        if not self._idle():
            self._drain()
        cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.cmd_pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        fill(cb)
        self._barrier(cb, host=True)
        vk.vkEndCommandBuffer(cb)
        cbs = self.ffi.new("VkCommandBuffer[1]", [cb])
        si = self.ffi.new("VkSubmitInfo*")
        si.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        si.commandBufferCount = 1
        si.pCommandBuffers = cbs
        self._submit_and_wait(si)
        vk.vkFreeCommandBuffers(self.device, self.cmd_pool, 1, [cb])

    def _host_bytes(self, buffer: VkBuffer, array) -> np.ndarray:
        raw = buffer_bytes(array, buffer.dtype, VulkanError)
        if raw.size != buffer.nbytes:
            raise VulkanError(f"cannot write {list(np.shape(array))} into a buffer of "
                              f"{list(buffer.shape)}")
        return raw

    def upload(self, buffer: VkBuffer, array) -> None:
        self._check()
        self._write_now(buffer, self._host_bytes(buffer, array))

    def _write_now(self, buffer: VkBuffer, raw: np.ndarray) -> None:
        """Write ``raw`` (a whole buffer's bytes) after every submission has run."""
        if not self._idle():                # the GPU may still read it
            self._drain()
        if buffer.host is not None:
            buffer.host[:buffer.nbytes] = raw
            return
        st = self._staging_for(buffer.nbytes)
        st.host[:buffer.nbytes] = raw
        region = self.vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=buffer.size)
        self._one_shot(lambda cb: self.vk.vkCmdCopyBuffer(cb, st.buffer, buffer.buffer, 1,
                                                          [region]))

    def upload_rows(self, buffer: VkBuffer, start: int, array) -> None:
        """Write ``array`` over rows ``start..`` (first axis) of ``buffer`` (after the pending
        submission): one sequence's row of carried state, without the rest."""
        self._check()
        a = np.asarray(array)
        if a.dtype != buffer.dtype and buffer.dtype == np.uint16 and a.dtype.itemsize == 2:
            a = a.view(np.uint16)
        raw = np.ascontiguousarray(a.astype(buffer.dtype, copy=False)).reshape(-1).view(
            np.uint8)
        row = int(np.prod(buffer.shape[1:], dtype=np.int64)) * buffer.dtype.itemsize
        off = start * row
        if raw.size % row or start < 0 or off + raw.size > buffer.nbytes:
            raise VulkanError(f"cannot write {list(a.shape)} at row {start} of a buffer of "
                              f"{list(buffer.shape)}")
        if not self._idle():
            self._drain()
        if buffer.host is not None:
            buffer.host[off:off + raw.size] = raw
            return
        st = self._staging_for(raw.size)
        st.host[:raw.size] = raw
        region = self.vk.VkBufferCopy(srcOffset=0, dstOffset=off, size=raw.size)
        self._one_shot(lambda cb: self.vk.vkCmdCopyBuffer(cb, st.buffer, buffer.buffer, 1,
                                                          [region]))

    def download(self, buffer: VkBuffer) -> np.ndarray:
        self._check()
        if not self._idle():
            self._drain()
        if buffer.host is not None:
            raw = buffer.host[:buffer.nbytes]
        else:
            st = self._staging_for(buffer.nbytes)
            region = self.vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=buffer.size)
            self._one_shot(lambda cb: self.vk.vkCmdCopyBuffer(cb, buffer.buffer, st.buffer, 1,
                                                              [region]))
            raw = st.host[:buffer.nbytes]
        return raw.view(buffer.dtype).reshape(buffer.shape).copy()

    def upload_async(self, buffer: VkBuffer, array) -> None:
        """Queue a write of ``array`` into ``buffer`` after the work issued so far (its bytes
        are copied at once: the caller may reuse it). With nothing in flight, or past
        :data:`MAX_INLINE_UPLOAD` bytes, it is :meth:`upload`."""
        self._check()
        raw = self._host_bytes(buffer, array)
        n = (raw.size + 3) // 4 * 4
        if self._idle() or n > MAX_INLINE_UPLOAD or n > buffer.size:
            return self._write_now(buffer, raw)
        if n != raw.size:
            raw = np.concatenate([raw, np.zeros(n - raw.size, np.uint8)])
        self._flush_reads()
        t = self._transfer(buffer)
        self.lib.vkCmdUpdateBuffer(t.cb, buffer.buffer, 0, n, self.ffi.from_buffer(raw))

    def copy_rows_async(self, src: VkBuffer, dst: VkBuffer,
                        runs: Sequence[tuple[int, int, int]]) -> None:
        """Queue copies of rows of ``src`` into ``dst`` after the work issued so far: one
        ``vkCmdCopyBuffer`` of a region a run of consecutive rows, in the open transfer command
        buffer (submitted before the next replay); with nothing in flight, at once
        (:meth:`Device.copy_rows_async <poot.runtime.device.Device.copy_rows_async>`)."""
        self._check()
        regions = [self.vk.VkBufferCopy(srcOffset=a, dstOffset=b, size=n)
                   for a, b, n in row_regions(src, dst, runs)]
        if not regions:
            return
        if self._idle():
            self._one_shot(lambda cb: self.vk.vkCmdCopyBuffer(cb, src.buffer, dst.buffer,
                                                              len(regions), regions))
            return
        self._flush_reads()
        t = self._transfer(src, dst)
        self.vk.vkCmdCopyBuffer(t.cb, src.buffer, dst.buffer, len(regions), regions)

    def download_async(self, buffer: VkBuffer):
        """Queue a read of ``buffer`` after the work issued so far: a :class:`VkReadback`
        (a finished one when nothing is in flight)."""
        self._check()
        if self._idle():
            return Ready(self.download(buffer))
        slot = next((b for b in self._read_free if b.size >= buffer.size), None)
        if slot is None:
            slot = self._make_buffer(max(buffer.size, 256), np.uint8, (buffer.size,), host=True)
        else:
            self._read_free.remove(slot)
        t = self._transfer(buffer, slot)
        t.reads += 1
        self.vk.vkCmdCopyBuffer(t.cb, buffer.buffer, slot.buffer, 1, [self.vk.VkBufferCopy(
            srcOffset=0, dstOffset=0, size=buffer.size)])
        return VkReadback(self, t, slot, buffer.dtype, buffer.shape, buffer.nbytes)

    # ---- programs ----------------------------------------------------------------------------
    def in_place_outputs(self, kernel: VkLoadedKernel) -> set[str]:
        """Outputs the program writes over their aliased input's own buffer (the artifact's
        ``in_place``): bound to that input's buffer they cost no copy (see the Session)."""
        return set(kernel.artifact.in_place)

    def load(self, program) -> VkLoadedKernel:
        """Load a compiled step: a Program whose ``executable`` is a VulkanArtifact, an
        artifact, or an artifact directory."""
        self._check()
        vk = self.vk
        art = getattr(program, "executable", program)
        if isinstance(art, (str, os.PathLike)):
            art = VulkanArtifact.load(Path(art))
        if not isinstance(art, VulkanArtifact):
            raise VulkanError(f"{type(art).__name__} is not a compiled Vulkan program")
        args = [VkKernelArg(*a) for a in art.arguments()]
        pipelines, set_layouts, layouts, modules = [], [], [], []
        for k in art.kernels:
            code = k.spirv
            mod = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code),
                pCode=code), None)
            binds = [vk.VkDescriptorSetLayoutBinding(
                binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for i in range(k.bindings)]
            sl = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                bindingCount=len(binds), pBindings=binds), None)
            pl = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1,
                pSetLayouts=[sl]), None)
            stage = vk.VkPipelineShaderStageCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=mod, pName=k.entry)
            pipe = vk.vkCreateComputePipelines(self.device, vk.VK_NULL_HANDLE, 1, [
                vk.VkComputePipelineCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage,
                    layout=pl)], None)[0]
            pipelines.append(pipe)
            set_layouts.append(sl)
            layouts.append(pl)
            modules.append(mod)
        temps = {}
        for i, b in enumerate(art.buffers):
            if b["kind"] in ("temp", "const"):
                n = int(b["nbytes"])
                temps[i] = self._make_buffer(n, np.uint8, (n,),
                                             host=self._unified or n < self.staging_threshold)
                if b["kind"] == "const":
                    data = np.frombuffer(bytes.fromhex(b["data"]), np.uint8)
                    t = temps[i]
                    t.nbytes = data.size
                    t.shape = (data.size,)
                    self.upload(t, data)
        k = VkLoadedKernel(args, art, pipelines, set_layouts, layouts, modules, temps, program)
        self._kernels.append(k)
        return k

    def _barrier(self, cb, host: bool = False, shaders_only: bool = False):
        """A memory barrier: shader and transfer writes before it made visible to shader and
        transfer access after it (``host``: to host reads; ``shaders_only``: between two
        dispatches, compute stage to compute stage)."""
        vk = self.vk
        if shaders_only:
            mb = vk.VkMemoryBarrier(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
            stage = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
            vk.vkCmdPipelineBarrier(cb, stage, stage, 0, 1, [mb], 0, None, 0, None)
            return
        mb = vk.VkMemoryBarrier(
            sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=(vk.VK_ACCESS_HOST_READ_BIT if host else
                           vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
                           | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT))
        src = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        dst = vk.VK_PIPELINE_STAGE_HOST_BIT if host else src
        vk.vkCmdPipelineBarrier(cb, src, dst, 0, 1, [mb], 0, None, 0, None)

    def record(self, kernel: VkLoadedKernel, bindings: Sequence[VkBuffer],
               copies: Sequence[tuple[VkBuffer, VkBuffer]] = (),
               timestamps: bool = False) -> VkRecording:
        """Descriptor sets for every dispatch and one command buffer for the whole step,
        ending with the whole-buffer ``copies`` ``(src, dst)`` (equal byte sizes).
        ``timestamps``: also write a timestamp query before the first step and after each
        step's barrier (``recording.query_pool``, read by :meth:`profile_kernel`)."""
        self._check()
        vk, ffi = self.vk, self.ffi
        art = kernel.artifact
        check_bindings(kernel.args, bindings, VkBuffer, VulkanError)
        check_copies(copies, VkBuffer, VulkanError)
        def buf(i) -> VkBuffer:
            return art.buffer_of(i, bindings, kernel.temps)

        disp = [s for s in art.steps if s.op == "dispatch"]
        n_desc = sum(art.kernels[s.kernel].bindings for s in disp)
        pool = None
        sets = []
        if disp:
            pool = vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=len(disp),
                poolSizeCount=1, pPoolSizes=[vk.VkDescriptorPoolSize(
                    type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=n_desc)]), None)
            sets = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=pool,
                descriptorSetCount=len(disp),
                pSetLayouts=[kernel.set_layouts[s.kernel] for s in disp]))
            writes = []
            for ds, s in zip(sets, disp):
                bufs = [buf(i) for i in s.args] + [self._err]
                if len(bufs) != art.kernels[s.kernel].bindings:
                    raise VulkanError(f"kernel {art.kernels[s.kernel].name}: plan binds "
                                      f"{len(bufs)} buffers to "
                                      f"{art.kernels[s.kernel].bindings} bindings")
                for j, b in enumerate(bufs):
                    writes.append(vk.VkWriteDescriptorSet(
                        sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=ds,
                        dstBinding=j, dstArrayElement=0, descriptorCount=1,
                        descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                        pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buffer, offset=0,
                                                               range=b.size)]))
            vk.vkUpdateDescriptorSets(self.device, len(writes), writes, 0, None)
        cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.cmd_pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, flags=0))
        queries = None
        if timestamps:
            queries = vk.vkCreateQueryPool(self.device, vk.VkQueryPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=len(art.steps) + 1), None)
            vk.vkCmdResetQueryPool(cb, queries, 0, len(art.steps) + 1)
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 0)
        it = iter(sets)
        # a barrier goes in front of a step only when it touches a buffer the steps since the
        # last barrier touched (weights and constant tables are only read: never a hazard);
        # between two dispatches it is compute to compute. With timestamps every step ends
        # with one, so each dispatch is timed alone.
        fixed = {i for i, b in enumerate(art.buffers) if b["kind"] in ("param", "const")}
        touched: set[int] = set()
        ops: set[str] = set()
        barriers = 0
        for i, s in enumerate(art.steps):
            if s.op == "copy" and buf(s.src) is buf(s.dst) and queries is None:
                continue                # state written in place, bound to one buffer
            if s.op == "dispatch":
                ids = {id(buf(a)) for a in s.args if a not in fixed}
            else:
                ids = {id(buf(s.src)), id(buf(s.dst))}
            if ids & touched and queries is None:
                self._barrier(cb, shaders_only=ops == {"dispatch"} and s.op == "dispatch")
                barriers += 1
                touched, ops = set(), set()
            touched |= ids
            ops.add(s.op)
            if s.op == "dispatch":
                vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                     kernel.pipelines[s.kernel])
                vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                           kernel.pipeline_layouts[s.kernel], 0, 1, [next(it)],
                                           0, None)
                vk.vkCmdDispatch(cb, *[int(g) for g in s.groups])
            else:
                src, dst = buf(s.src), buf(s.dst)
                if src is not dst:
                    vk.vkCmdCopyBuffer(cb, src.buffer, dst.buffer, 1, [vk.VkBufferCopy(
                        srcOffset=0, dstOffset=0, size=min(src.size, dst.size, s.nbytes + 3
                                                           - (s.nbytes + 3) % 4))])
            if queries is not None:
                self._barrier(cb)
                vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries,
                                       i + 1)
        if copies:
            self._barrier(cb)
        for src, dst in copies:
            vk.vkCmdCopyBuffer(cb, src.buffer, dst.buffer, 1, [vk.VkBufferCopy(
                srcOffset=0, dstOffset=0, size=min(src.size, dst.size))])
        self._barrier(cb)                  # orders the next submission after this one
        self._barrier(cb, host=True)
        vk.vkEndCommandBuffer(cb)
        cbs = ffi.new("VkCommandBuffer[1]", [cb])
        si = ffi.new("VkSubmitInfo*")
        si.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        si.commandBufferCount = 1
        si.pCommandBuffers = cbs
        rec = VkRecording(kernel, cb, pool, si, [cbs, sets, list(bindings), list(copies)],
                          query_pool=queries, barriers=barriers)
        self._recordings.append(rec)
        self.records += 1
        return rec

    # ---- running -----------------------------------------------------------------------------
    def replay(self, recording: VkRecording) -> None:
        """Resubmit the recorded command buffer (one ``vkQueueSubmit``, no re-recording),
        behind the queued transfers, and return without waiting."""
        self._check()
        if len(self._inflight) >= MAX_IN_FLIGHT:
            self._wait_through(self._inflight[0].seq)
        self._flush_reads()
        self._submit(recording)
        recording.submits += 1
        self.replays += 1

    def profile_kernel(self, kernel: VkLoadedKernel, bindings: Sequence[VkBuffer],
                       repeats: int = 3, top: int = 16) -> dict:
        """Where one step's GPU time goes: the step is recorded with a full barrier and a
        timestamp after every step of the plan (so each dispatch runs alone, where a replay
        places barriers only at hazards -- 182 of SmolLM2's 183 decode dispatches), replayed ``repeats`` + 1 times (the first warms up), and each dispatch's time
        is the gap to the timestamp before it (its own run plus draining the barrier; the
        minimum over the replays). The buffers' current contents are used and rewritten as a
        step would.

        Returns ``{"total_ms", "by_kind": {kind: {"ms", "dispatches", "launches"}}, "top":
        [{"callee", "kind", "copies", "us", "weight_bytes", "GBps", "launches": [groups,
        ...]}, ...]`` (the ``top`` kernels by total time, ``us`` per copy), ``step_ms`` (first
        to last timestamp) and a ``note`` -- the shape of the CUDA runtime's profile.

        Raises:
            VulkanError: the queue family writes no timestamps.
        """
        self._check()
        vk, ffi = self.vk, self.ffi
        qprops = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        if not qprops[self.queue_family].timestampValidBits:
            raise VulkanError(f"'{self.device_name}' writes no timestamps on its compute "
                              f"queue: no per-dispatch profile")
        period_ns = float(self.properties.limits.timestampPeriod)
        art = kernel.artifact
        rec = self.record(kernel, bindings, timestamps=True)
        n = len(art.steps) + 1
        data = ffi.new("uint64_t[]", n)
        best, step_ms = None, float("inf")
        for _ in range(max(1, repeats) + 1):
            self.replay(rec)
            self.synchronize()
            r = self.lib.vkGetQueryPoolResults(
                self.device, rec.query_pool, 0, n, 8 * n, data, 8,
                vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            if r != vk.VK_SUCCESS:
                raise VulkanError(f"vkGetQueryPoolResults failed with VkResult {r}")
            t = np.frombuffer(ffi.buffer(data, 8 * n), np.uint64).astype(np.float64)
            us = np.diff(t) * period_ns / 1e3
            best = us if best is None else np.minimum(best, us)
            step_ms = min(step_ms, float(t[-1] - t[0]) * period_ns / 1e6)
        nbytes = {i: int(b["nbytes"]) for i, b in enumerate(art.buffers)}
        params = {i for i, b in enumerate(art.buffers) if b["kind"] == "param"}
        rows: dict = {}
        by_kind: dict[str, dict] = {}
        for s, us in zip(art.steps, best):
            kind = art.dispatches[s.dispatch]["kind"] if 0 <= s.dispatch < len(art.dispatches) \
                else "copy"
            k = by_kind.setdefault(kind, {"ms": 0.0, "dispatches": 0, "launches": 0})
            k["ms"] += float(us) / 1e3
            k["launches"] += 1
            if s.op != "dispatch":
                continue
            k["dispatches"] += 1
            row = rows.setdefault(s.kernel, {
                "callee": art.dispatches[s.dispatch]["name"] if s.dispatch >= 0 else "",
                "kernel": art.kernels[s.kernel].name, "kind": kind, "copies": 0, "us": 0.0,
                "weight_bytes": sum(nbytes[b] for b in set(s.args) if b in params),
                "launches": [list(s.groups)]})
            row["copies"] += 1
            row["us"] += float(us)
        out = []
        for row in rows.values():
            row["us"] = round(row["us"] / row["copies"], 2)
            w = row["weight_bytes"]
            row["GBps"] = round(w / (row["us"] * 1e-6) / 1e9, 1) if w and row["us"] else None
            out.append(row)
        out.sort(key=lambda r: -r["us"] * r["copies"])
        for k in by_kind.values():
            k["ms"] = round(k["ms"], 4)
        return {"total_ms": round(sum(k["ms"] for k in by_kind.values()), 4),
                "step_ms": round(step_ms, 4), "by_kind": by_kind, "top": out[:top],
                "note": "timestamps after each dispatch's barrier in one recorded step "
                        "(min over replays): a dispatch's time includes draining its barrier"}

    # ---- the queue ---------------------------------------------------------------------------
    def _idle(self) -> bool:
        return not self._inflight and self._xfer is None

    def _transfer(self, *buffers: VkBuffer) -> _Transfer:
        """The open transfer command buffer, begun on first use; a barrier goes in first
        when it already touched one of ``buffers`` (transfers are unordered without one)."""
        vk = self.vk
        t = self._xfer
        if t is None:
            if self._free_xfer:
                cb = self._free_xfer.pop()
            else:
                cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                    commandPool=self.cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                    commandBufferCount=1))[0]
            vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            t = self._xfer = _Transfer(cb)
        ids = {id(b) for b in buffers}
        if ids & t.touched:
            self._barrier(t.cb)
        t.touched |= ids
        return t

    def _flush_reads(self) -> None:
        """Submit the open transfer command buffer alone when it holds readback copies and
        something else is about to be queued: a read of step n must not wait for step n+1
        (the pipelined loop issues step n+1 before it waits for step n's token)."""
        if self._xfer is not None and self._xfer.reads:
            self._submit(None)

    def _submit(self, recording: VkRecording | None) -> None:
        """One ``vkQueueSubmit``: the open transfer command buffer (ended with a barrier to
        the shader, transfer and host reads) then ``recording``'s, under a fence of its own."""
        ffi, vk = self.ffi, self.vk
        t, self._xfer = self._xfer, None
        cbs = []
        if t is not None:
            self._barrier(t.cb)
            self._barrier(t.cb, host=True)
            vk.vkEndCommandBuffer(t.cb)
            cbs.append(t.cb)
        if recording is not None:
            cbs.append(recording.command_buffer)
        if t is None and recording is not None:
            si, keep = recording.submit, ()         # prebuilt at record time
        else:
            arr = ffi.new("VkCommandBuffer[]", cbs)
            si = ffi.new("VkSubmitInfo*")
            si.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
            si.commandBufferCount = len(cbs)
            si.pCommandBuffers = arr
            keep = (arr, si)
        fence = self._free_fences.pop() if self._free_fences else vk.vkCreateFence(
            self.device, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO),
            None)
        fence_arr = ffi.new("VkFence[1]", [fence])
        r = self.lib.vkQueueSubmit(self.queue, 1, si, fence)
        if r != vk.VK_SUCCESS:
            self._poison(f"vkQueueSubmit failed with VkResult {r}")
        self._seq += 1
        if t is not None:
            t.seq = self._seq
        if recording is not None:
            self._last_recording = recording
        self._inflight.append(_Submission(self._seq, fence, fence_arr, recording, t, keep))

    def _wait_through(self, seq: int) -> None:
        """Wait (bounded) for every submission up to ``seq``, recycling their fences,
        transfer command buffers and released readback slots; raise :class:`KernelFault`
        when a kernel check set the error word."""
        while self._inflight and self._inflight[0].seq <= seq:
            s = self._inflight[0]
            self._wait(s.fence_arr)
            self._inflight.popleft()
            self._free_fences.append(s.fence)
            if s.transfer is not None:
                self.lib.vkResetCommandBuffer(s.transfer.cb, 0)
                self._free_xfer.append(s.transfer.cb)
            self._raise_fault(s.recording or self._last_recording)
        if self._read_spent:
            done = self._inflight[0].seq if self._inflight else self._seq + 1
            ran = [(t, b) for t, b in self._read_spent if t.seq is not None and t.seq < done]
            self._read_free += [b for _, b in ran]
            self._read_spent = [e for e in self._read_spent if e not in ran]

    def _drain(self) -> None:
        """Submit the queued transfers and wait for every submission."""
        if self._xfer is not None:
            self._submit(None)
        self._wait_through(self._seq)

    def _raise_fault(self, recording: VkRecording | None) -> None:
        err = self._err.host.view(np.uint32)
        if err[0]:
            code, k = int(err[0]), int(err[1])
            err[:] = 0
            raise KernelFault(code, recording.kernel.artifact.faulting_kernel(k)
                              if recording is not None else None)

    def _submit_and_wait(self, si) -> None:
        r = self.lib.vkQueueSubmit(self.queue, 1, si, self.fence)
        if r != self.vk.VK_SUCCESS:
            self._poison(f"vkQueueSubmit failed with VkResult {r}")
        self._wait(self._fence_arr)

    def _wait(self, fence_arr) -> None:
        timeout = int(max(0.0, self.fence_timeout_s) * 1e9)
        r = self.lib.vkWaitForFences(self.device, 1, fence_arr, 1, timeout)
        if r == self.vk.VK_TIMEOUT:
            self._poison(f"fence wait timed out after {self.fence_timeout_s:g} s")
        if r != self.vk.VK_SUCCESS:
            self._poison(f"vkWaitForFences failed with VkResult {r}")
        self.lib.vkResetFences(self.device, 1, fence_arr)

    def synchronize(self) -> None:
        """Wait (bounded) for everything submitted and queued; raise :class:`KernelFault` if
        a kernel check set the error word."""
        self._check()
        self._drain()

    def close(self) -> None:
        """Destroy everything (a poisoned device leaks instead: pending work may still run)."""
        if self._closed:
            return
        self._closed = True
        if self._poisoned:
            return
        vk = self.vk
        vk.vkDeviceWaitIdle(self.device)
        for r in self._recordings:
            if r.pool is not None:
                vk.vkDestroyDescriptorPool(self.device, r.pool, None)
            if r.query_pool is not None:
                vk.vkDestroyQueryPool(self.device, r.query_pool, None)
        for k in self._kernels:
            for p, pl, sl, m in zip(k.pipelines, k.pipeline_layouts, k.set_layouts, k.modules):
                vk.vkDestroyPipeline(self.device, p, None)
                vk.vkDestroyPipelineLayout(self.device, pl, None)
                vk.vkDestroyDescriptorSetLayout(self.device, sl, None)
                vk.vkDestroyShaderModule(self.device, m, None)
        for b in self._buffers:
            b.host = None
            vk.vkDestroyBuffer(self.device, b.buffer, None)
            vk.vkFreeMemory(self.device, b.memory, None)
        vk.vkDestroyFence(self.device, self.fence, None)
        for f in self._free_fences + [s.fence for s in self._inflight]:
            vk.vkDestroyFence(self.device, f, None)
        vk.vkDestroyCommandPool(self.device, self.cmd_pool, None)
        vk.vkDestroyDevice(self.device, None)
        vk.vkDestroyInstance(self.instance, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def available() -> str | None:
    """None when a Vulkan device with robustBufferAccess opens here, else why not."""
    try:
        VulkanDevice().close()
    except VulkanError as e:
        return str(e)
    return None


__all__ = ["DEFAULT_FENCE_TIMEOUT_S", "DeviceLost", "KernelFault", "RobustnessUnavailable",
           "VkBuffer", "VkKernelArg", "VkLoadedKernel", "VkRecording", "VulkanDevice",
           "VulkanError", "VulkanUnavailable", "available", "buffer_bytes", "host_layout"]


def open_device() -> "VulkanDevice":
    """The registry's ``open_device`` hook of ``vulkan``: the best Vulkan device; a missing
    ``vulkan`` package, loader or device is a :class:`~poot.backends.cpu.runtime.DeviceError`."""
    import importlib.util

    if importlib.util.find_spec("vulkan") is None:
        raise DeviceError("the vulkan backend needs the 'vulkan' package: "
                          "pip install 'poot[vulkan]'")
    try:
        return VulkanDevice()
    except VulkanError as e:
        raise DeviceError(f"no usable Vulkan device: {e}") from None
