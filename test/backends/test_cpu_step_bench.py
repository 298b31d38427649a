"""bench/cpu_step.py's step choice: ``--batch B`` times a decode step of B rows (one sequence
each), ``--prefill T`` a prefill step; bad combinations are argparse errors (exit 2) named on
one line, before any model is loaded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_step.py"


@pytest.fixture(scope="module")
def cpu_step():
    spec = importlib.util.spec_from_file_location("cpu_step", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_batch_is_a_decode_step_of_b_rows(cpu_step):
    s = cpu_step._spec(0, 8)
    assert (s.kind, s.batch, s.tokens, s.kv_slots) == ("decode", 8, 1, 8)
    assert cpu_step._spec(0, 1).batch == 1
    p = cpu_step._spec(64, 1)
    assert (p.kind, p.tokens) == ("prefill", 64)


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--batch", "4", "--prefill", "16"],
                                  ["--prefill", "-1"]])
def test_bad_step_arguments_are_usage_errors(cpu_step, argv, capsys):
    with pytest.raises(SystemExit) as e:
        cpu_step.main(argv)
    assert e.value.code == 2
    assert "--batch must be >= 1" in capsys.readouterr().err


def test_per_kind_runs_a_scatter_in_place_as_the_step_does(cpu_step):
    """The per-kind estimate compiles each dispatch alone: a scatter into the KV pool must
    write into its pool argument (no out-parameter, no copy of the whole pool per call) as
    it does inside the step, or the estimate counts a pool copy the step never makes."""
    import ctypes

    import numpy as np

    from poot.backends.cpu import codegen as cpu
    from poot.compiler import CompileOptions, compile
    from poot.compiler.target import host_cpu
    from poot.dialects.types import DType, TensorType
    from poot.graph.builder import Builder, TraceLimits

    b = Builder(TraceLimits(max_values=100, max_ops=100, max_literal_bytes=1 << 16,
                            max_owned_bytes=1 << 20))
    pool = b.input("pool", TensorType((64, 16), DType.F32))
    idx = b.input("idx", TensorType((2, 1), DType.I32))
    upd = b.input("upd", TensorType((2, 16), DType.F32))
    g = b.finish({"pool_out": b.scatter(pool, idx, b.binary("mul", upd, upd))})
    lowered = compile(g, host_cpu(), CompileOptions()).executable.lowered
    seen = []
    for name, kind, calls, fn, arrays in cpu_step.compiled_dispatches(lowered):
        if kind != "scatter":
            continue
        seen.append(name)
        assert [a.shape for a in arrays] == [(64, 16), (2, 1), (2, 16)]  # no pool result
        pool_a, idx_a, upd_a = arrays
        idx_a[:, 0] = [3, 60]
        upd_a[...] = np.arange(32, dtype=np.float32).reshape(2, 16)
        descs = [cpu._descriptor(a) for a in arrays]
        ptrs = [ctypes.pointer(d) for d in descs]
        packed = (ctypes.c_void_p * len(ptrs))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
        fn(packed)
        want = np.zeros((64, 16), np.float32)
        want[[3, 60]] = upd_a
        np.testing.assert_array_equal(pool_a, want)
    assert seen == ["step_dispatch_1"]
