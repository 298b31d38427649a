"""``poot-opt``: an ``mlir-opt``-style driver with the poot dialect and poot's passes.

Reads ``.mlir`` (a file or ``-``), loads the poot dialect, verifies poot ops by their rules,
runs a pipeline mixing poot's Python passes and upstream MLIR passes, and prints the result.

    poot-opt in.mlir --pass-pipeline='builtin.module(poot-verify,canonicalize,cse)'
    poot-opt in.mlir --poot-verify --split-input-file
    poot-opt bad.mlir --verify-diagnostics      # checks `// expected-error @+1 {{...}}`
    poot-opt step.mlir --gpu-kernels --gpu-subgroup-size=32 --gpu-cores=4

``--gpu-kernels`` plans the (compiled) step function for a GPU target of the given
capabilities, as every gpu-dialect backend does (:func:`poot.backends.gpu.plan.plan_program`:
the strategies, region folding, horizontal fusion), and prints the kernels' ``gpu.module``
(each ``gpu.func`` with its ``known_block_size``) then one comment line per launch
(``// launch @kernel grid [x, y, z] block [x, y, z] strategy name``) and per scratch buffer.
No GPU is needed: it prints the IR a backend would lower.

Exit status: 0 on success, 1 when the input fails to parse/verify or a pass fails (or, with
``--verify-diagnostics``, when diagnostics and expectations disagree), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from types import SimpleNamespace

from mlir import ir

from poot.backends.vulkan.target import vulkan_target
from poot.compiler.planning import check_module
from poot.compiler.target import Capabilities, Target
from poot.backends.registry import load_backend_passes
from poot.dialects import irdl_text, make_context
from poot.dialects.lowering.packed import DECODERS
from poot.dialects.verify import verify_module
from poot.errors import PootError
from poot.graph.builder import Graph
from poot.passes.registry import (PipelineError, build_pass_manager, load_all_passes,
                                  take_failures)

SPLIT_MARKER = "// -----"


@dataclass
class Diag:
    line: int | None
    text: str  # "file:line:col: error: message"
    message: str


def _parser() -> argparse.ArgumentParser:
    load_backend_passes()
    passes = load_all_passes()
    epilog = "poot passes:\n" + "\n".join(
        f"  --{p.argument:<28} {p.summary}" +
        "".join(f"\n      {k}={t.__name__} (default {d}): {h}" for k, (t, d, h) in
                p.options.items())
        for p in sorted(passes.values(), key=lambda p: p.argument))
    epilog += ("\n\nUpstream MLIR passes are named inside --pass-pipeline, e.g.\n"
               "  --pass-pipeline='builtin.module(poot-verify,canonicalize,cse)'")
    ap = argparse.ArgumentParser(prog="poot-opt", epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="MLIR optimizer driver with the poot dialect")
    ap.add_argument("input", nargs="?", default="-", help="input .mlir file (default: stdin)")
    ap.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    ap.add_argument("--pass-pipeline", "-p", default="", help="textual pass pipeline")
    ap.add_argument("--split-input-file", action="store_true",
                    help=f"process chunks separated by '{SPLIT_MARKER}' independently")
    ap.add_argument("--verify-diagnostics", action="store_true",
                    help="check emitted errors against expected-error comments")
    ap.add_argument("--print-irdl", action="store_true",
                    help="print the poot dialect's IRDL definition and exit")
    for p in passes.values():
        ap.add_argument(f"--{p.argument}", action="append_const", const=p.argument,
                        dest="pass_flags", help=p.summary)
    gpu = ap.add_argument_group("GPU kernels", "--gpu-kernels and the target it plans for")
    gpu.add_argument("--gpu-kernels", action="store_true",
                     help="after the pipeline, print the GPU kernels (gpu.module) and launches "
                          "of the step function")
    gpu.add_argument("--gpu-subgroup-size", type=int, default=32, metavar="N",
                     help="threads per subgroup (warp), a power of two (default 32)")
    gpu.add_argument("--gpu-shared-bytes", type=int, default=48 * 1024, metavar="N",
                     help="workgroup (shared) memory per block in bytes (default 49152)")
    gpu.add_argument("--gpu-cores", type=int, default=132, metavar="N",
                     help="compute units (SMs) (default 132)")
    gpu.add_argument("--gpu-features", default="", metavar="A,B",
                     help="target features, comma-separated: sm_90 (CUDA vector loads, mma "
                          "from sm_80), workgroup_view, mfma, wmma (default none)")
    return ap


def gpu_caps(subgroup_size: int, shared_bytes: int, cores: int, features: str) -> Capabilities:
    """The capabilities ``--gpu-kernels`` plans for: every storage dtype and packed decoder,
    the KV formats the shared plan's kernels read in place (those a GPU target lists in
    ``Capabilities.kv_formats``: q8_0, read by the paged-attention lowering through the
    generic mapping as on Vulkan), ``subgroup_size`` threads per subgroup, ``shared_bytes``
    of workgroup memory, ``cores`` compute units, ``features`` (comma-separated names).
    Raises ValueError naming a bad value."""
    if subgroup_size < 1 or subgroup_size & (subgroup_size - 1):
        raise ValueError(f"--gpu-subgroup-size must be a power of two, not {subgroup_size}")
    if shared_bytes < 0:
        raise ValueError(f"--gpu-shared-bytes must not be negative, not {shared_bytes}")
    if cores < 1:
        raise ValueError(f"--gpu-cores must be at least 1, not {cores}")
    feats = frozenset(f.strip() for f in features.split(",") if f.strip())
    return Capabilities(packed_formats=frozenset(DECODERS), cores=cores,
                        subgroup_size=subgroup_size, max_shared_bytes=shared_bytes,
                        features=feats, kv_formats=vulkan_target().caps.kv_formats)


def gpu_kernels_text(module: ir.Module, caps: Capabilities) -> str:
    """The GPU plan of ``module``'s step function (its first public ``func.func``, calling
    outlined dispatch regions) for ``caps``, as text: the kernels' module, then a comment line
    per launch and per scratch buffer. Raises :class:`~poot.errors.PootError` (a region no
    kernel covers, a module without a step function; a
    :class:`~poot.compiler.planning.Refusal` for an op ``caps`` cannot run, as
    :func:`~poot.compiler.compile` refuses it)."""
    # lazy: the GPU strategies import ml_dtypes (about 0.6 s), which only --gpu-kernels needs
    from poot.backends.gpu.plan import plan_program

    check_module(module.operation, Target("gpu", caps))
    plan = plan_program(SimpleNamespace(graph=Graph.from_module(module), storage=[]), caps)
    lines = [str(plan.module).rstrip("\n")]
    for L in plan.launches:
        if L["op"] == "kernel":
            lines.append(f"// launch @{plan.kernels[L['kernel']]} grid {L['grid']} "
                         f"block {L['block']} strategy {L['strategy']}")
        else:
            lines.append(f"// copy buffer {L['src']} -> {L['dst']} ({L['nbytes']} bytes)")
    for b in plan.buffers:
        if b["role"] == "scratch":
            lines.append(f"// scratch {b['name']} {b['type']} ({b['nbytes']} bytes)")
    return "\n".join(lines) + "\n"


def _chunks(text: str, split: bool) -> list[tuple[int, str]]:
    """(first line number - 1, text) per chunk, padded so MLIR's line numbers stay absolute."""
    if not split:
        return [(0, text)]
    out, start = [], 0
    for piece in re.split(r"^// -----.*$", text, flags=re.M):
        out.append((start, "\n" * start + piece))
        start += piece.count("\n")
    return out


def _parse_loc(loc: str, filename: str) -> tuple[int | None, str]:
    m = re.search(r'"?(?:-|[^":]*)"?:(\d+):(\d+)', loc)
    if not m:
        return None, f"{filename}"
    return int(m.group(1)), f"{filename}:{m.group(1)}:{m.group(2)}"


def process_chunk(text: str, pipeline: str, filename: str,
                  caps: Capabilities | None = None) -> tuple[str | None, list[Diag]]:
    """Parse, verify and transform one chunk. Returns (printed IR or None, diagnostics);
    with ``caps`` the printed IR is the GPU kernels of the result (:func:`gpu_kernels_text`)."""
    ctx = make_context()
    diags: list[Diag] = []
    with ctx:
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            for d in e.error_diagnostics:
                line, where = _parse_loc(str(d.location), filename)
                msg = _name_op(d)
                diags.append(Diag(line, f"{where}: error: {msg}", msg))
            return None, diags
        for d in verify_module(module):
            line, where = _parse_loc(d.location, filename)
            diags.append(Diag(line, f"{where}: error: {d.message}", d.message))
        if diags:
            return None, diags
        if pipeline:
            pm = build_pass_manager(pipeline, ctx)
            try:
                pm.run(module.operation)
            except ir.MLIRError as e:
                fails = take_failures()
                for msg in fails or [str(x.message) for x in e.error_diagnostics]:
                    for one in msg.splitlines():
                        m = re.match(r"(\S+?):(\d+):(\d+): error: (.*)", one)
                        line = int(m.group(2)) if m else None
                        diags.append(Diag(line, one if m else f"{filename}: error: {one}",
                                          m.group(4) if m else one))
                return None, diags
        if caps is not None:
            return gpu_kernels_text(module, caps), diags
        return str(module), diags


def _name_op(d) -> str:
    """IRDL's structural errors do not name the op; MLIR's note with the operation does."""
    msg = str(d.message)
    if msg.startswith("'"):
        return msg
    msg = msg.removeprefix("op ")  # upstream count errors already say "op expects ..."
    for note in d.notes:
        m = re.search(r'see current operation: .*?"([\w.]+)"\(', str(note.message))
        if m:
            return f"'{m.group(1)}' op {msg}"
    return msg


_EXPECT = re.compile(r"//\s*expected-error\s*(@[+-]\d+|@above|@below)?\s*\{\{(.*?)\}\}")


def _expectations(text: str) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in _EXPECT.finditer(line):
            off = m.group(1)
            target = i
            if off in ("@above",):
                target = i - 1
            elif off == "@below":
                target = i + 1
            elif off:
                target = i + int(off[1:])
            out.append((target, m.group(2)))
    return out


def _check_expectations(expected, diags: list[Diag], filename: str) -> list[str]:
    problems, used = [], set()
    for line, msg in expected:
        hit = next((k for k, d in enumerate(diags)
                    if k not in used and d.line == line and msg in d.message), None)
        if hit is None:
            problems.append(f"{filename}:{line}: error: expected error \"{msg}\" was not produced")
        else:
            used.add(hit)
    for k, d in enumerate(diags):
        if k not in used:
            problems.append(f"{d.text}  (unexpected error)")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.print_irdl:
        sys.stdout.write(irdl_text())
        return 0
    if args.pass_pipeline and args.pass_flags:
        print("poot-opt: error: use either --pass-pipeline or pass flags", file=sys.stderr)
        return 2
    pipeline = args.pass_pipeline or ",".join(args.pass_flags or [])
    caps = None
    if args.gpu_kernels:
        try:
            caps = gpu_caps(args.gpu_subgroup_size, args.gpu_shared_bytes, args.gpu_cores,
                            args.gpu_features)
        except ValueError as e:
            print(f"poot-opt: error: {e}", file=sys.stderr)
            return 2
    filename = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.input, "rb") as f:
                data = f.read()
    except OSError as e:
        print(f"poot-opt: error: cannot read {args.input}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        print(f"poot-opt: error: {filename}: input is not valid UTF-8 at byte {e.start}",
              file=sys.stderr)
        return 2
    outputs, failed, problems = [], False, []
    try:
        for _, chunk in _chunks(text, args.split_input_file):
            out, diags = process_chunk(chunk, pipeline, filename, caps)
            if args.verify_diagnostics:
                problems += _check_expectations(_expectations(chunk), diags, filename)
            else:
                for d in diags:
                    print(d.text, file=sys.stderr)
                failed |= bool(diags)
            if out is not None:
                outputs.append(out)
    except PipelineError as e:
        print(f"poot-opt: error: {e}", file=sys.stderr)
        return 2
    except PootError as e:
        print(f"poot-opt: error: {e}", file=sys.stderr)
        return 1
    if args.verify_diagnostics:
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    result = f"\n{SPLIT_MARKER}\n".join(outputs)
    if args.output == "-":
        try:
            sys.stdout.write(result)
            sys.stdout.flush()
        except BrokenPipeError:  # `poot-opt ... | head`: the reader left; not an error
            sys.stdout = open(os.devnull, "w")
    else:
        with open(args.output, "w") as f:
            f.write(result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
