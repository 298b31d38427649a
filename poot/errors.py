"""The typed error hierarchy shared by every layer of poot.

Every error a user can cause (a malformed file, a bad request, a graph past a limit) is a
subclass of :class:`PootError`; the CLI prints it as one line ``poot: error: ...`` and exits
with status 2. Anything else escaping is a bug in poot.
"""

from __future__ import annotations


class PootError(Exception):
    """Base of every user-facing poot error."""


class LimitExceeded(PootError):
    """A request past a caller-stated limit, refused before anything was allocated.

    Attributes:
        resource: what was being counted (``"ops"``, ``"owned_bytes"``, ...).
        limit: the stated limit.
        attempted: the total the request would have reached.
    """

    def __init__(self, resource: str, limit: int, attempted: int, where: str = ""):
        self.resource, self.limit, self.attempted = resource, limit, attempted
        at = f" in {where}" if where else ""
        super().__init__(f"{resource} limit exceeded{at}: limit {limit}, attempted {attempted}")
