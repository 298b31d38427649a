"""Settings of the whole test run, made before any test module is imported.

``POOT_COMPILE_WORKERS=0`` (unless set already): a cold load compiles the steps it needs in
its own process, and no worker process compiles ahead (:mod:`poot.api.compile_ahead`). Under
``pytest -n auto`` every core already runs a test worker, so compile workers add no
parallelism, only CPU: a process that imports MLIR per cold load, and steps no test asks for
(a server's larger ragged steps, compiled ahead for a burst of arrivals no test sends). The
variable is in the environment, so the CLI and server processes the tests start inherit it.
The tests of compile-ahead itself set it (test_compile_ahead.py, test_compile_serve.py,
test_ready_time.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("POOT_COMPILE_WORKERS", "0")
