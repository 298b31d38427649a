"""Fixtures of the server tests: the tiny Q4_1 GGUF fixture with a chat template (CI), one
loaded handle of it shared by the module servers, and SmolLM2 where installed."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

for mod in ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx"):
    pytest.importorskip(mod, reason=f"the server tests need {mod} (pip install -e "
                                    f"\".[test,serve]\")")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "driver"))

from chat_fixture import chat_gguf  # noqa: E402

from server_util import load_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    """The tiny Q4_1 GGUF with a chat template (256-token vocabulary, 128 positions)."""
    return chat_gguf(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    return os.environ.get("POOT_CACHE_DIR") or str(tmp_path_factory.mktemp("poot-cache"))


@pytest.fixture(scope="session")
def tiny(tiny_path, cache_dir):
    """One loaded tiny handle shared by the servers of this directory (one at a time)."""
    return load_tiny(tiny_path, cache_dir)


@pytest.fixture(scope="module")
def server(tiny):
    """A server of the tiny handle on 127.0.0.1 (model name ``tiny``)."""
    from server_util import running

    with running(tiny) as srv:
        yield srv


class Gate:
    """Pauses the engine loop between steps, deterministically: while closed, the engine
    thread waits before its next step (its commands -- adds, aborts -- queue up meanwhile).
    ``close_after_token``: close itself after a step that produced a token; ``close_if``: a
    predicate of a step's outputs that closes it (once) when true."""

    def __init__(self, engine):
        self.engine = engine
        self.open_ = threading.Event()
        self.open_.set()
        self.close_after_token = False
        self.close_if = None
        self._orig = engine.step

        def step():
            self.open_.wait(60)
            outs = self._orig()
            if self.close_after_token and any(o.token_ids for o in outs):
                self.close_after_token = False
                self.open_.clear()
            if self.close_if is not None and self.close_if(outs):
                self.close_if = None
                self.open_.clear()
            return outs

        engine.step = step

    def close(self) -> None:
        self.open_.clear()

    def open(self) -> None:
        self.open_.set()

    def remove(self) -> None:
        self.open_.set()
        del self.engine.step          # the class's method again


@pytest.fixture
def gate(tiny):
    g = Gate(tiny.engine)
    try:
        yield g
    finally:
        g.remove()
