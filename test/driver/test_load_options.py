"""``ModelHandle.load(path, backend, options, **overrides)``: a :class:`LoadOptions`, keyword
overrides of its fields, or both (the keywords win); an unknown keyword is a TypeError."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from poot.api import LoadOptions, ModelHandle
from poot.sampling_params import InvalidRequest

LLAMA = Path(__file__).resolve().parents[2] / "test" / "fixtures" / "tiny" / "llama"


def _no_compile(graph):
    raise AssertionError("compiled before validating")


def _load(options=None, **kw):
    return ModelHandle.load(LLAMA, "cpu", options, compile_fn=_no_compile, device=object(),
                            **kw)


def test_options_are_frozen_with_defaults():
    opts = LoadOptions()
    assert (opts.kv_capacity, opts.pipeline_parallel, opts.warm_batches) == (None, 1, (1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.kv_capacity = 4


@pytest.mark.parametrize("field,bad", [("kv_capacity", 0), ("prefill_chunk", -1),
                                       ("max_batch", 0), ("kv_memory", True)])
def test_options_object_is_checked(field, bad):
    with pytest.raises(InvalidRequest) as e:
        _load(LoadOptions(**{field: bad}))
    assert e.value.field == field


def test_keyword_overrides_the_options_object():
    with pytest.raises(InvalidRequest) as e:     # the keyword's bad value, not the object's
        _load(LoadOptions(kv_capacity=16), kv_capacity=-3)
    assert (e.value.field, e.value.value) == ("kv_capacity", -3)
    handle = _load(LoadOptions(kv_capacity=-3), kv_capacity=16, warm_up=False)
    assert handle.kv_capacity == 16


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="kv_capcity"):
        _load(kv_capcity=16)
