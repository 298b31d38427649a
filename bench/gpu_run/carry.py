"""What the GPU scripts' build steps share: the folders they carry to the GPU machine.

A device call carries at most 64 MiB *including the tracked tree* (~14 MB), and only the paths
it names; so each build writes under ``.cache/gpu/`` (ignored) and keeps every folder under
:data:`CARRY_LIMIT`. The SmolLM2 GGUF (98 MB) goes in :data:`GGUF_PARTS` parts, one folder a
call; ``stage_gguf.sh`` copies each carried part to ``/tmp/gguf`` on the machine (which lasts
while the machine is held) and joins them, checked against the sha256 recorded here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: where every build writes its carried folders (git-ignored)
GPU_CACHE = os.path.join(ROOT, ".cache", "gpu")
#: the most one carried folder may hold, bytes (64 MiB less the tracked tree and a margin)
CARRY_LIMIT = 46 << 20
#: the SmolLM2 GGUF's parts: .cache/gpu/gguf0 ... (one carry each)
GGUF_PARTS = 3


def folder_bytes(d: str) -> int:
    """Bytes of every file under ``d`` (0 when it does not exist)."""
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def fresh_dir(name: str, keep: tuple[str, ...] = ()) -> str:
    """``.cache/gpu/NAME`` emptied (entries named in ``keep`` stay) and returned."""
    d = os.path.join(GPU_CACHE, name)
    for f in os.listdir(d) if os.path.isdir(d) else []:
        if f not in keep:
            p = os.path.join(d, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.makedirs(d, exist_ok=True)
    return d


def split_gguf(gguf: str, parts: int = GGUF_PARTS) -> dict:
    """Write ``gguf`` as ``parts`` pieces, ``.cache/gpu/gguf{i}/smollm2.part{i}``, each folder
    with ``gguf.json`` (part count, total bytes, sha256) for ``stage_gguf.sh``; returns that."""
    data = open(gguf, "rb").read()
    info = {"file": os.path.basename(gguf), "parts": parts, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
    step = -(-len(data) // parts)
    for i in range(parts):
        d = fresh_dir(f"gguf{i}")
        with open(os.path.join(d, f"smollm2.part{i}"), "wb") as f:
            f.write(data[i * step:(i + 1) * step])
        with open(os.path.join(d, "gguf.json"), "w") as f:
            json.dump(info, f)
    return info


def download_wheels(dest: str, requirements: list[str], python: str = "312",
                    deps: bool = True) -> None:
    """pip-download ``requirements`` as manylinux wheels for CPython ``python`` into ``dest``
    (the GPU machine reaches no package index). Raises CalledProcessError when pip fails."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
           "--python-version", python, "--platform", "manylinux2014_x86_64", "-d", dest]
    subprocess.run(cmd + ([] if deps else ["--no-deps"]) + requirements, check=True)


def check_sizes(dirs: list[str]) -> list[str]:
    """The folders of ``dirs`` over :data:`CARRY_LIMIT` (each printed to stderr)."""
    over = [d for d in dirs if folder_bytes(d) > CARRY_LIMIT]
    for d in over:
        print(f"{d}: {folder_bytes(d)} bytes exceed one carry ({CARRY_LIMIT})", file=sys.stderr)
    return over
