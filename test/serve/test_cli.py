"""``poot serve``'s command line: sizes, option errors as one ``poot: error:`` line (status 2)
before anything loads, and ``--kv-memory`` sizing the KV pool."""

from __future__ import annotations

import socket

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
