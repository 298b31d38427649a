"""AQL (Architected Queuing Language) packets, encoded as bytes. Imports no MLIR.

Source: the HSA Platform System Architecture Specification 1.2 (section 2.9, "Architected
Queuing Language") and the HSA Runtime Programmer's Reference Manual 1.2 (``hsa.h``:
``hsa_kernel_dispatch_packet_t``, ``hsa_barrier_and_packet_t``, ``hsa_packet_header_t``).
Every AQL packet is 64 bytes, little-endian:

``hsa_kernel_dispatch_packet_t``::

    offset size field
     0     2    header                (see below)
     2     2    setup                 bits 0-1: number of grid dimensions (1..3)
     4     2    workgroup_size_x      work-items
     6     2    workgroup_size_y
     8     2    workgroup_size_z
    10     2    reserved0             must be 0
    12     4    grid_size_x           work-items (NOT workgroups)
    16     4    grid_size_y
    20     4    grid_size_z
    24     4    private_segment_size  bytes per work-item
    28     4    group_segment_size    bytes per workgroup (LDS)
    32     8    kernel_object         code descriptor address (symbol info KERNEL_OBJECT)
    40     8    kernarg_address       kernel argument block (16-byte aligned)
    48     8    reserved2             must be 0
    56     8    completion_signal     hsa_signal_t handle, 0 for none

``hsa_barrier_and_packet_t``::

     0     2    header
     2     2    reserved0
     4     4    reserved1
     8    40    dep_signal[5]         hsa_signal_t handles (0 = none)
    48     8    reserved2
    56     8    completion_signal

Header (u16): bits 0-7 packet type (``HSA_PACKET_TYPE_*``), bit 8 barrier (the packet
starts only after every earlier packet of the queue completed), bits 9-10 acquire fence
scope, bits 11-12 release fence scope (``HSA_FENCE_SCOPE_NONE/AGENT/SYSTEM`` = 0/1/2), bits
13-15 reserved (0).

Publication: the packet processor may read a slot as soon as its header's type is not
``INVALID``. So a producer writes bytes 4..63 first and the 32-bit word at offset 0 (header
in the low half, setup / reserved0 in the high half) LAST, with a release store:
:func:`body` and :func:`header_word` give the two parts.
"""

from __future__ import annotations

import struct

from poot.errors import PootError

PACKET_BYTES = 64

# hsa_packet_type_t
PACKET_TYPE_VENDOR_SPECIFIC = 0
PACKET_TYPE_INVALID = 1
PACKET_TYPE_KERNEL_DISPATCH = 2
PACKET_TYPE_BARRIER_AND = 3
PACKET_TYPE_AGENT_DISPATCH = 4
PACKET_TYPE_BARRIER_OR = 5

# hsa_fence_scope_t
FENCE_SCOPE_NONE = 0
FENCE_SCOPE_AGENT = 1
FENCE_SCOPE_SYSTEM = 2

# hsa_packet_header_t (bit offsets) and hsa_packet_header_width_t
HEADER_TYPE = 0
HEADER_BARRIER = 8
HEADER_ACQUIRE_FENCE_SCOPE = 9
HEADER_RELEASE_FENCE_SCOPE = 11

#: dispatch layout: little-endian, no padding (64 bytes; offsets in the module doc)
_DISPATCH = struct.Struct("<HHHHHHIIIIIQQQQ")
_BARRIER_AND = struct.Struct("<HHI5QQQ")
assert _DISPATCH.size == PACKET_BYTES and _BARRIER_AND.size == PACKET_BYTES

U16, U32, U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1


class AqlError(PootError):
    """A packet field out of its range (the message names the field and the value)."""


def _check(name: str, value: int, top: int, low: int = 0) -> int:
    v = int(value)
    if not low <= v <= top:
        raise AqlError(f"AQL {name} = {v} is outside [{low}, {top}]")
    return v


def header(packet_type: int, barrier: bool = False, acquire: int = FENCE_SCOPE_SYSTEM,
           release: int = FENCE_SCOPE_SYSTEM) -> int:
    """The 16-bit packet header: ``packet_type`` in bits 0-7, ``barrier`` in bit 8, the
    acquire fence scope in bits 9-10, the release fence scope in bits 11-12 (HSA runtime
    spec, ``hsa_packet_header_t``). Raises :class:`AqlError` for a value out of range."""
    _check("packet type", packet_type, 0xFF)
    _check("acquire fence scope", acquire, FENCE_SCOPE_SYSTEM)
    _check("release fence scope", release, FENCE_SCOPE_SYSTEM)
    return (packet_type << HEADER_TYPE) | (int(bool(barrier)) << HEADER_BARRIER) \
        | (acquire << HEADER_ACQUIRE_FENCE_SCOPE) | (release << HEADER_RELEASE_FENCE_SCOPE)


def dispatch_packet(kernel_object: int, kernarg_address: int, grid: tuple, workgroup: tuple,
                    group_segment_size: int = 0, private_segment_size: int = 0,
                    completion_signal: int = 0, barrier: bool = True,
                    acquire: int = FENCE_SCOPE_SYSTEM,
                    release: int = FENCE_SCOPE_SYSTEM) -> bytes:
    """A 64-byte ``hsa_kernel_dispatch_packet_t``.

    ``grid``: the grid size in WORK-ITEMS per dimension (1 to 3 values; the number given sets
    ``setup``'s dimensions, missing ones are 1). ``workgroup``: work-items per workgroup, same
    length. ``kernel_object``: the symbol's KERNEL_OBJECT; ``kernarg_address``: a 16-byte
    aligned kernarg block address; ``completion_signal``: a signal handle (0: none).
    Raises :class:`AqlError` for a field outside its width, a zero size or an unaligned
    kernarg address (a grid need not be a multiple of the workgroup: HSA allows partial
    workgroups)."""
    dims = len(grid)
    if not 1 <= dims <= 3 or len(workgroup) != dims:
        raise AqlError(f"AQL dispatch needs 1 to 3 grid dimensions and as many workgroup "
                       f"sizes, got grid {list(grid)} and workgroup {list(workgroup)}")
    g = [_check(f"grid_size_{'xyz'[i]}", v, U32, 1) for i, v in enumerate(grid)] \
        + [1] * (3 - dims)
    w = [_check(f"workgroup_size_{'xyz'[i]}", v, U16, 1) for i, v in enumerate(workgroup)] \
        + [1] * (3 - dims)
    if int(kernarg_address) % 16:
        raise AqlError(f"AQL kernarg_address {int(kernarg_address):#x} is not 16-byte aligned")
    return _DISPATCH.pack(
        header(PACKET_TYPE_KERNEL_DISPATCH, barrier, acquire, release), dims,
        w[0], w[1], w[2], 0, g[0], g[1], g[2],
        _check("private_segment_size", private_segment_size, U32),
        _check("group_segment_size", group_segment_size, U32),
        _check("kernel_object", kernel_object, U64),
        _check("kernarg_address", kernarg_address, U64), 0,
        _check("completion_signal", completion_signal, U64))


def barrier_and_packet(dep_signals=(), completion_signal: int = 0, barrier: bool = True,
                       acquire: int = FENCE_SCOPE_SYSTEM,
                       release: int = FENCE_SCOPE_SYSTEM) -> bytes:
    """A 64-byte ``hsa_barrier_and_packet_t``: completes once every one of ``dep_signals``
    (at most 5 signal handles; unused slots 0) reads 0, then decrements
    ``completion_signal`` (0: none). Raises :class:`AqlError` for more than 5 signals."""
    deps = [int(s) for s in dep_signals]
    if len(deps) > 5:
        raise AqlError(f"an AQL barrier-AND packet takes at most 5 signals, got {len(deps)}")
    deps = [_check("dep_signal", s, U64) for s in deps] + [0] * (5 - len(deps))
    return _BARRIER_AND.pack(header(PACKET_TYPE_BARRIER_AND, barrier, acquire, release), 0, 0,
                             *deps, 0, _check("completion_signal", completion_signal, U64))


def header_word(packet: bytes) -> int:
    """The first 32 bits of ``packet`` (header | setup << 16 for a dispatch): the word a
    producer stores LAST, with release semantics, to hand the packet to the processor."""
    return struct.unpack_from("<I", packet, 0)[0]


def body(packet: bytes) -> bytes:
    """Bytes 4..63 of ``packet``: everything but the header word, written first."""
    return bytes(packet[4:PACKET_BYTES])


def decode_dispatch(packet: bytes) -> dict:
    """The fields of a 64-byte dispatch packet, by their ``hsa.h`` names, with the header
    split into ``type``/``barrier``/``acquire``/``release`` (for checks and fakes)."""
    f = _DISPATCH.unpack(bytes(packet[:PACKET_BYTES]))
    names = ("header", "setup", "workgroup_size_x", "workgroup_size_y", "workgroup_size_z",
             "reserved0", "grid_size_x", "grid_size_y", "grid_size_z", "private_segment_size",
             "group_segment_size", "kernel_object", "kernarg_address", "reserved2",
             "completion_signal")
    d = dict(zip(names, f))
    h = d["header"]
    d.update(type=h & 0xFF, barrier=(h >> 8) & 1, acquire=(h >> 9) & 3, release=(h >> 11) & 3,
             dimensions=d["setup"] & 3)
    return d


__all__ = ["AqlError", "FENCE_SCOPE_AGENT", "FENCE_SCOPE_NONE", "FENCE_SCOPE_SYSTEM",
           "PACKET_BYTES", "PACKET_TYPE_BARRIER_AND", "PACKET_TYPE_INVALID",
           "PACKET_TYPE_KERNEL_DISPATCH", "barrier_and_packet", "body", "decode_dispatch",
           "dispatch_packet", "header", "header_word"]
