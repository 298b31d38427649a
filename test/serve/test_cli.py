"""``poot serve``'s command line: sizes, option errors as one ``poot: error:`` line (status 2)
before anything loads, and ``--kv-memory`` sizing the KV pool."""

from __future__ import annotations

import socket
import sys

import pytest

from poot.cli import main
from poot.cli.serve_cmd import parse_bytes
from poot.sampling_params import InvalidRequest


def test_parse_bytes():
    assert parse_bytes("1048576") == 1 << 20
    assert parse_bytes("2GiB") == 2 << 30
    assert parse_bytes("512M") == 512 << 20
    assert parse_bytes("1.5k") == 1536
    for bad in ("", "lots", "-1G", "1PB"):
        with pytest.raises(InvalidRequest):
            parse_bytes(bad)


@pytest.mark.parametrize("argv,says", [
    (["--kv-blocks", "4", "--kv-memory", "1GiB"], "--kv-memory"),
    (["--kv-memory", "lots"], "--kv-memory"),
    (["--max-batch", "0"], "--max-batch"),
    (["--max-queue", "-1"], "--max-queue"),
    (["--max-decode-stall", "1"], "--max-decode-stall"),
    (["--max-decode-stall", "-2"], "--max-decode-stall"),
    (["--max-decode-stall", "nan"], "--max-decode-stall"),
    (["--port", "70000"], "--port"),
    (["--max-n", "0"], "--max-n"),
    (["--max-pooled-rows", "0"], "--max-pooled-rows"),
])
def test_option_errors(argv, says, capsys, tiny_path):
    assert main(["serve", "--model", str(tiny_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("poot: error: ") and says in err[-1], err


def test_port_in_use(capsys, tiny_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["serve", "--model", str(tiny_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("poot: error: ") and "cannot listen" in err[-1], err


def test_kv_memory_sizes_the_pool(tiny_path, cache_dir):
    from server_util import load_tiny

    h = load_tiny(tiny_path, cache_dir, max_batch=2)
    per_block = h.runner.kv.bytes(h.model.dims()) // h.runner.kv.num_blocks
    m = load_tiny(tiny_path, cache_dir, max_batch=2, kv_memory=10 * per_block + 5)
    assert m.runner.kv.num_blocks == 10 and m.engine.stats().kv_blocks_total == 9
    with pytest.raises(InvalidRequest, match="kv_memory"):
        load_tiny(tiny_path, cache_dir, max_batch=2, kv_memory=per_block)


def test_switch_interval_setting(monkeypatch):
    """``poot serve`` runs with POOT_SERVE_SWITCH_INTERVAL as the GIL's switch interval
    (default 0.1 ms); a value that is not a positive number is a typed error naming it."""
    from poot.serve.server import shorten_switch_interval
    from poot.settings import InvalidSetting

    before = sys.getswitchinterval()
    try:
        monkeypatch.delenv("POOT_SERVE_SWITCH_INTERVAL", raising=False)
        assert shorten_switch_interval() == 1e-4
        assert sys.getswitchinterval() == pytest.approx(1e-4)
        monkeypatch.setenv("POOT_SERVE_SWITCH_INTERVAL", "0.002")
        assert shorten_switch_interval() == 0.002
        assert sys.getswitchinterval() == pytest.approx(0.002)
        for bad in ("0", "-1", "fast"):
            monkeypatch.setenv("POOT_SERVE_SWITCH_INTERVAL", bad)
            with pytest.raises(InvalidSetting, match="POOT_SERVE_SWITCH_INTERVAL"):
                shorten_switch_interval()
    finally:
        sys.setswitchinterval(before)


def test_switch_interval_error_before_loading(monkeypatch, capsys, tiny_path):
    monkeypatch.setenv("POOT_SERVE_SWITCH_INTERVAL", "soon")
    before = sys.getswitchinterval()
    assert main(["serve", "--model", str(tiny_path), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("poot: error: POOT_SERVE_SWITCH_INTERVAL='soon'"), err
    assert sys.getswitchinterval() == before
