"""The AQL packet encoder against the HSA runtime spec's layouts (``hsa.h`` 1.2:
``hsa_kernel_dispatch_packet_t``, ``hsa_barrier_and_packet_t``, ``hsa_packet_header_t``).
The offsets and bit positions below are written from the spec, not from the encoder."""

from __future__ import annotations

import struct

import pytest

from poot.backends.rocm import aql

# hsa_kernel_dispatch_packet_t, from the spec: (offset, struct format) per field
DISPATCH = {"header": (0, "<H"), "setup": (2, "<H"), "workgroup_size_x": (4, "<H"),
            "workgroup_size_y": (6, "<H"), "workgroup_size_z": (8, "<H"),
            "reserved0": (10, "<H"), "grid_size_x": (12, "<I"), "grid_size_y": (16, "<I"),
            "grid_size_z": (20, "<I"), "private_segment_size": (24, "<I"),
            "group_segment_size": (28, "<I"), "kernel_object": (32, "<Q"),
            "kernarg_address": (40, "<Q"), "reserved2": (48, "<Q"),
            "completion_signal": (56, "<Q")}


def field(packet: bytes, name: str, layout=DISPATCH) -> int:
    off, fmt = layout[name]
    return struct.unpack_from(fmt, packet, off)[0]


def test_dispatch_fields_at_spec_offsets():
    p = aql.dispatch_packet(kernel_object=0x1122334455667788, kernarg_address=0xAABBCCDD0010,
                            grid=(256 * 3, 5, 7), workgroup=(256, 1, 7),
                            group_segment_size=4096, private_segment_size=48,
                            completion_signal=0xDEADBEEF0001)
    assert isinstance(p, bytes) and len(p) == 64
    assert field(p, "setup") & 0b11 == 3 and field(p, "setup") >> 2 == 0
    assert (field(p, "workgroup_size_x"), field(p, "workgroup_size_y"),
            field(p, "workgroup_size_z")) == (256, 1, 7)
    assert field(p, "reserved0") == 0
    # grid sizes are in work-items, as given
    assert (field(p, "grid_size_x"), field(p, "grid_size_y"), field(p, "grid_size_z")) \
        == (768, 5, 7)
    assert field(p, "private_segment_size") == 48
    assert field(p, "group_segment_size") == 4096
    assert field(p, "kernel_object") == 0x1122334455667788
    assert field(p, "kernarg_address") == 0xAABBCCDD0010
    assert field(p, "reserved2") == 0
    assert field(p, "completion_signal") == 0xDEADBEEF0001


def test_one_dimension_fills_the_rest_with_one():
    p = aql.dispatch_packet(1, 16, grid=(1000,), workgroup=(64,))
    assert field(p, "setup") == 1
    assert (field(p, "grid_size_y"), field(p, "grid_size_z")) == (1, 1)
    assert (field(p, "workgroup_size_y"), field(p, "workgroup_size_z")) == (1, 1)
    assert field(p, "completion_signal") == 0


@pytest.mark.parametrize("barrier,acq,rel", [(True, 2, 2), (False, 1, 0), (True, 0, 1),
                                             (False, 2, 1)])
def test_header_bits(barrier, acq, rel):
    p = aql.dispatch_packet(1, 16, grid=(64,), workgroup=(64,), barrier=barrier,
                            acquire=acq, release=rel)
    h = field(p, "header")
    assert h & 0xFF == 2                        # HSA_PACKET_TYPE_KERNEL_DISPATCH
    assert (h >> 8) & 1 == int(barrier)         # HSA_PACKET_HEADER_BARRIER = 8
    assert (h >> 9) & 0b11 == acq               # ..._SCACQUIRE_FENCE_SCOPE = 9, width 2
    assert (h >> 11) & 0b11 == rel              # ..._SCRELEASE_FENCE_SCOPE = 11, width 2
    assert h >> 13 == 0


def test_header_constants_match_spec():
    assert (aql.PACKET_TYPE_INVALID, aql.PACKET_TYPE_KERNEL_DISPATCH,
            aql.PACKET_TYPE_BARRIER_AND) == (1, 2, 3)
    assert (aql.FENCE_SCOPE_NONE, aql.FENCE_SCOPE_AGENT, aql.FENCE_SCOPE_SYSTEM) == (0, 1, 2)
    # the usual "dispatch, barrier, system acquire and release" header
    assert aql.header(2, True, 2, 2) == 2 | 1 << 8 | 2 << 9 | 2 << 11 == 0x1502


def test_header_word_and_body_split():
    p = aql.dispatch_packet(7, 32, grid=(128, 2), workgroup=(64, 2), barrier=True)
    word = aql.header_word(p)
    assert word & 0xFFFF == field(p, "header")
    assert word >> 16 == field(p, "setup") == 2
    assert aql.body(p) == p[4:] and len(aql.body(p)) == 60


def test_barrier_and_packet_layout():
    p = aql.barrier_and_packet([11, 22, 33], completion_signal=99, barrier=False,
                               acquire=1, release=2)
    assert len(p) == 64
    h = struct.unpack_from("<H", p, 0)[0]
    assert h & 0xFF == 3 and (h >> 8) & 1 == 0 and (h >> 9) & 3 == 1 and (h >> 11) & 3 == 2
    assert struct.unpack_from("<H", p, 2)[0] == 0           # reserved0
    assert struct.unpack_from("<I", p, 4)[0] == 0           # reserved1
    assert struct.unpack_from("<5Q", p, 8) == (11, 22, 33, 0, 0)   # dep_signal[5] @ 8
    assert struct.unpack_from("<Q", p, 48)[0] == 0          # reserved2
    assert struct.unpack_from("<Q", p, 56)[0] == 99         # completion_signal
    with pytest.raises(aql.AqlError, match="at most 5"):
        aql.barrier_and_packet(range(1, 7))


def test_decode_roundtrip():
    p = aql.dispatch_packet(5, 64, grid=(96, 4, 2), workgroup=(32, 4, 1),
                            group_segment_size=1, private_segment_size=2, completion_signal=3,
                            barrier=True, acquire=1, release=2)
    d = aql.decode_dispatch(p)
    assert (d["type"], d["barrier"], d["acquire"], d["release"], d["dimensions"]) \
        == (2, 1, 1, 2, 3)
    assert (d["grid_size_x"], d["workgroup_size_y"], d["kernarg_address"]) == (96, 4, 64)


@pytest.mark.parametrize("kwargs,match", [
    ({"grid": (0,), "workgroup": (64,)}, "grid_size_x"),
    ({"grid": (64,), "workgroup": (1 << 16,)}, "workgroup_size_x"),
    ({"grid": (1 << 32,), "workgroup": (64,)}, "grid_size_x"),
    ({"grid": (64, 1), "workgroup": (64,)}, "dimensions"),
    ({"grid": (64,), "workgroup": (64,), "acquire": 3}, "acquire"),
])
def test_out_of_range_fields_are_refused(kwargs, match):
    with pytest.raises(aql.AqlError, match=match):
        aql.dispatch_packet(1, 16, **kwargs)


def test_unaligned_kernarg_is_refused():
    with pytest.raises(aql.AqlError, match="16-byte"):
        aql.dispatch_packet(1, 24, grid=(64,), workgroup=(64,))
