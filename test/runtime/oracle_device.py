"""A test-side Device over the CPU oracle: the executor contract without a code generator.

It lets the engine and the driver loop be tested on whole model steps independently of the
CPU backend's progress (generation itself never uses the oracle)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from poot.compiler.planning import plan_storage
from poot.dialects.quant_layout import deinterleave
from poot.dialects.types import PackedType
from poot.backends.cpu.runtime import copy_views
from poot.runtime.device import KernelArg, Ready, host_dtype, host_shape
from poot.oracle import evaluate


@dataclass
class OracleProgram:
    graph: object
    storage: list = field(default_factory=list)


def oracle_compile(graph) -> OracleProgram:
    return OracleProgram(graph, plan_storage(graph.func, graph.inputs, graph.outputs,
                                             graph.params))


def _logical(buf, t):
    """A host buffer viewed as its graph dtype (f16/bf16 are stored as uint16 words)."""
    dt = getattr(t, "dtype", None)
    if dt is not None and buf.dtype == np.uint16 and dt.numpy != np.uint16:
        return buf.view(dt.numpy)
    return buf


@dataclass
class OracleKernel:
    args: list
    graph: object


class OracleDevice:
    name = "oracle"
    overlaps = False

    def __init__(self):
        self.records = 0
        self.replays = 0
        self._layouts: dict[int, object] = {}   # id(buffer) -> its row-interleaved type

    def alloc(self, t):
        buf = np.zeros(host_shape(t), host_dtype(t))
        if isinstance(t, PackedType) and t.format.rows > 1:
            self._layouts[id(buf)] = (buf, t)      # a weight the session stores repacked
        return buf

    def _as_declared(self, buf, t):
        """A weight the session stored in a row-interleaved layout (the host target's
        storage rule) as the graph declares it: the oracle reads the file's layout."""
        held = self._layouts.get(id(buf))
        if held is None or held[0] is not buf or held[1] == t:
            return buf
        return deinterleave(held[1].format, buf, held[1].shape)

    def upload(self, buf, a):
        a = np.asarray(a)
        if buf.dtype == np.uint16 and a.dtype.itemsize == 2 and a.dtype != np.uint16:
            a = a.view(np.uint16)              # f16/bf16 as their words
        np.copyto(buf, a.reshape(buf.shape), casting="same_kind")

    def download(self, buf):
        return buf.copy()

    def upload_async(self, buf, a):
        self.upload(buf, a)

    def download_async(self, buf):
        return Ready(buf.copy())

    def synchronize(self):
        pass

    def load(self, program):
        g = program.graph
        args = ([KernelArg("input", n, t) for n, t in g.inputs]
                + [KernelArg("param", n, t) for n, t in g.params.items()]
                + [KernelArg("output", n, t) for n, t in g.outputs])
        return OracleKernel(args, g)

    def record(self, kernel, bindings, copies=()):
        self.records += 1
        return (kernel, list(bindings), copy_views(copies))

    def replay(self, rec):
        kernel, bufs, copies = rec
        inputs, params, outs = {}, {}, {}
        for a, b in zip(kernel.args, bufs):
            if a.role != "param":
                b = _logical(b, a.type)
            else:
                b = self._as_declared(b, a.type)
            {"input": inputs, "param": params, "output": outs}[a.role][a.name] = b
        res = evaluate(kernel.graph, {k: v.copy() for k, v in inputs.items()}, params)
        for k, buf in outs.items():
            np.copyto(buf, np.asarray(res[k]).reshape(buf.shape), casting="unsafe")
        for src, dst in copies:
            np.copyto(dst, src)
        self.replays += 1
