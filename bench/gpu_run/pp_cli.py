"""``poot`` with ``--pipeline-parallel N`` run as N CUDA contexts on GPU 0 (the one-GPU
machine standing in for N GPUs): the stages, their CUDA graphs, the peer copies
(``cuMemcpyPeerAsync`` between contexts) and the event ordering are the multi-GPU code path;
only the overlap of stages on different GPUs is absent. ``POOT_PP_CONTEXTS=shared``: the N
devices share GPU 0's primary context instead (N streams, no context switches between
stages; the copies are device-to-device).

    python bench/gpu_run/pp_cli.py bench --backend cuda --pipeline-parallel 2 ...
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> int:
    import poot.runtime.pipeline_parallel as pipeline
    from poot.backends.cuda.runtime import CudaDevice
    from poot.cli import main as poot_main

    own = os.environ.get("POOT_PP_CONTEXTS", "own") != "shared"
    pipeline.open_pipeline_devices = lambda backend, n: [
        CudaDevice(0, own_context=own) for _ in range(n)]
    return poot_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
