"""``poot devices``: the devices each backend opens here, and their capabilities.

    poot devices [--backend B ...] [--json]

For each backend with a runtime (default: every registered one) opens its device, as
``poot generate`` would, and prints its capabilities (features, subgroup size, limits) or why
it does not open. ``--json`` prints ``{backend: capabilities}`` for the devices that opened:
the file ``poot compile --device-caps`` reads to compile, on a machine with MLIR, for a
Vulkan or wgpu device elsewhere. Needs no MLIR.
"""

from __future__ import annotations

import argparse
import json

from poot.backends.registry import BACKENDS
from poot.cli import plain


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("devices", help="the devices each backend opens here",
                              description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", action="append", choices=tuple(BACKENDS), default=None)
    p.add_argument("--json", action="store_true", help="{backend: capabilities} as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.runtime import DeviceError, open_device

    found, why = {}, {}
    for name in args.backend or [b.name for b in BACKENDS.values() if b.open_device]:
        try:
            dev = open_device(name)
        except DeviceError as e:
            why[name] = str(e)
            continue
        except ImportError as e:     # a runtime that needs what this machine lacks
            why[name] = f"{type(e).__name__}: {e}"
            continue
        caps = getattr(dev, "capabilities", None)
        found[name] = caps() if callable(caps) else {"name": getattr(dev, "name", name)}
    if args.json:
        print(json.dumps(found, indent=1, default=str))
    else:
        for name, caps in found.items():
            print(f"{name}: {json.dumps(caps, default=str)}")
        for name, reason in why.items():
            print(f"{name}: not available ({reason})")
    return 0 if found else 1
