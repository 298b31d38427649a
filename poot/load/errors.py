"""The loader's typed error: every malformed checkpoint is a :class:`LoadError`."""

from __future__ import annotations

import os

from poot.errors import PootError


class LoadError(PootError):
    """A checkpoint (GGUF, safetensors, config.json) that cannot be loaded as stored.

    Attributes:
        file: the path of the offending file (as given, or its basename for messages).
        field: which part of the file is wrong: a header field (``"magic"``, ``"version"``),
            a metadata key, a tensor name (``"tensor blk.0.attn_q.weight"``) or a config key.
        problem: what is wrong with it, in words, with the numbers involved.

    The message is ``<file>: <field>: <problem>``, one line, suitable for ``poot: error: ...``.
    """

    def __init__(self, file: str | os.PathLike, field: str, problem: str):
        self.file, self.field, self.problem = os.fspath(file), field, problem
        super().__init__(f"{self.file}: {field}: {problem}")
