"""End to end on the CPU backend: ModelHandle.load -> compile (cached) -> Engine[CpuDevice]
-> Driver, on the tiny fixtures (greedy ids vs reference.npz) and the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

from model_steps import fixture_path, reference  # noqa: E402

from poot.api import Driver, ModelHandle  # noqa: E402
from poot.api.generate import ContextOverflow  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402

FIXTURES = ["llama", "llama_gguf_q4_1"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("poot-cache")


@pytest.fixture(scope="module")
def handles(cache_dir):
    # one chunk a step even with nothing decoding, so prompts cross chunk boundaries
    cfg = EngineConfig(max_batch=8, idle_prefill_tokens=5)
    return {name: ModelHandle.load(fixture_path(name), kv_capacity=48, prefill_chunk=5,
                                   cache_dir=cache_dir, engine_config=cfg) for name in FIXTURES}


def _greedy(n=8, **kw):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def _agree(got, want, margins, tol=1e-3):
    n = next((i + 1 for i, m in enumerate(margins) if m < tol), len(want))
    assert list(got[:n]) == [int(x) for x in want[:n]]


@pytest.mark.parametrize("name", FIXTURES)
def test_cpu_greedy_matches_reference(handles, name):
    ref = reference(name)
    r = Driver(handles[name]).complete(list(ref["prompt_ids"]), _greedy())
    _agree(r.token_ids, ref["greedy_ids"], ref["greedy_margins"])
    assert r.stats.prefill_steps == 3          # 11 prompt rows in chunks of 5 (last padded)


@pytest.mark.parametrize("name", FIXTURES)
def test_cpu_replays_after_first_steps(handles, name):
    h = handles[name]
    dev = h.runner.session.device
    ref = reference(name)
    Driver(h).complete(list(ref["prompt_ids"]), _greedy(4))
    records = dev.records
    replays = dev.replays
    Driver(h).complete(list(ref["prompt_ids"]), _greedy(8))
    assert dev.records == records             # no argument array rebuilt
    # 3 ragged steps of prompt chunks, the last sampling the first token (+ its sampler),
    # then 7 decode steps of two programs each (the model, the sampler)
    assert dev.replays == replays + 3 + 1 + 2 * 7


def test_cpu_stops_and_overflow(handles):
    h = handles["llama_gguf_q4_1"]
    ref = reference("llama_gguf_q4_1")
    prompt = list(ref["prompt_ids"])
    full = Driver(h).complete(prompt, _greedy(8))
    stop_id = full.token_ids[3]
    r = Driver(h).complete(prompt, _greedy(8, stop_token_ids=[stop_id]))
    assert r.token_ids == full.token_ids[:full.token_ids.index(stop_id)]
    if len(full.text) >= 4:
        stop = full.text[2:4]
        r = Driver(h).complete(prompt, _greedy(8, stop=[stop]))
        assert r.text == full.text[:full.text.index(stop)] and r.stats.finish_reason == "stop"
    assert Driver(h).complete(prompt, _greedy(3)).stats.generated_tokens == 3
    with pytest.raises(ContextOverflow):
        Driver(h).generate(prompt, _greedy(48 - 12 + 1))


def test_cpu_seeded_sampling_reproducible(handles):
    h = handles["llama"]
    prompt = list(reference("llama")["prompt_ids"])
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=6, ignore_eos=True)
    a = Driver(h).complete(prompt, p).token_ids
    assert a == Driver(h).complete(prompt, p).token_ids


def test_compile_cache_hit_on_second_load(handles, cache_dir):
    h = ModelHandle.load(fixture_path("llama"), kv_capacity=48, prefill_chunk=5,
                         cache_dir=cache_dir)
    # the ragged step of one chunk, batch-1 decode, and the greedy sampler of each (5 rows,
    # 1 row)
    assert h.compile_cache.hits == 4 and h.compile_cache.misses == 0
    ref = reference("llama")
    r = Driver(h).complete(list(ref["prompt_ids"]), _greedy())
    _agree(r.token_ids, ref["greedy_ids"], ref["greedy_margins"])


def test_cli_generate_json_and_bench(handles, cache_dir, capsys, monkeypatch):
    from poot.cli import main

    monkeypatch.setenv("POOT_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("POOT_PIPELINE", raising=False)
    model = str(fixture_path("llama_gguf_q4_1"))
    rc = main(["generate", "--model", model, "--prompt", "hello world", "--max-tokens", "4",
               "--ignore-eos", "--kv-capacity", "48", "--prefill-chunk", "5", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["token_ids"]) == 4 and isinstance(out["text"], str)
    assert out["stats"]["generated_tokens"] == 4 and out["stats"]["finish_reason"] == "length"
    rc = main(["bench", "--model", model, "--tokens", "4", "--runs", "1", "--prompt-tokens",
               "7", "--kv-capacity", "48", "--prefill-chunk", "5"])
    b = json.loads(capsys.readouterr().out)
    assert rc == 0 and b["backend"] == "cpu" and b["generated_tokens"] == 4
    assert b["decode_tokens_per_s"] > 0 and b["ttft_s"] > 0
    # short names, no reprs; the CLI warms the sampler serving any options up too, for
    # decode batch 1 and for the rows of the ragged step of one chunk (min(5, max_batch 8));
    # the 7-token prompt, with nothing else decoding, runs as one step of 10 rows
    assert set(b["compile_s"]) == {"ragged[T=5]", "ragged[T=10]", "decode[B=1]", "sampler[B=1]",
                                   "sampler[B=1:sample+pen+bias+topk+topp+minp]",
                                   "sampler[B=5]", "sampler[B=5:sample+pen+bias+topk+topp+minp]"}
    assert b["pipelined"] is False and b["poot"]["pipelined"] is False   # CPU: sequential
    rc = main(["bench", "--model", model, "--tokens", "4", "--runs", "1", "--prompt-tokens",
               "7", "--kv-capacity", "48", "--prefill-chunk", "5", "--pipeline", "on",
               "--replay", "2"])
    b = json.loads(capsys.readouterr().out)
    assert rc == 0 and b["pipelined"] is True and b["generated_tokens"] == 4
    assert b["poot"]["replay_us_per_step"] > 0 and "host_us_per_token" in b["poot"]
    rc = main(["generate", "--model", model, "--prompt", "x " * 60, "--max-tokens", "4",
               "--kv-capacity", "48", "--prefill-chunk", "5"])
    assert rc == 2 and "exceeds the context capacity" in capsys.readouterr().err


def test_backend_without_a_runtime_here_is_a_typed_error():
    """ROCm compiles here but has no HSA runtime to run on: a DeviceError naming the
    library, before anything is compiled."""
    from poot.runtime.device import DeviceError

    with pytest.raises(DeviceError, match="libhsa-runtime64"):
        ModelHandle.load(fixture_path("llama"), backend="rocm", kv_capacity=16, use_cache=False)


def test_cli_prompts_file_runs_batched(handles, cache_dir, capsys, monkeypatch, tmp_path):
    """``poot generate --prompts-file``: plain lines and JSON lines with per-prompt
    parameters run batched; one JSON result a prompt, each equal to the prompt run alone;
    a bad line is a one-line error naming the line, before anything runs."""
    from poot.cli import main

    monkeypatch.setenv("POOT_CACHE_DIR", str(cache_dir))
    model = str(fixture_path("llama_gguf_q4_1"))
    f = tmp_path / "prompts.jsonl"
    f.write_text("hello world\n"
                 '{"prompt": "the cat", "max_tokens": 3}\n'
                 "\n"
                 '{"prompt": [5, 6, 7, 8], "temperature": 0.9, "seed": 3}\n')
    common = ["--model", model, "--kv-capacity", "48", "--prefill-chunk", "5",
              "--max-tokens", "5", "--ignore-eos", "--max-batch", "4"]
    rc = main(["generate", "--prompts-file", str(f), *common])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and sorted(x["index"] for x in lines) == [0, 1, 2]
    by = {x["index"]: x for x in lines}
    assert [len(by[i]["token_ids"]) for i in range(3)] == [5, 3, 5]
    h = handles["llama_gguf_q4_1"]
    alone = Driver(h).complete("hello world", _greedy(5))
    assert by[0]["token_ids"] == alone.token_ids and by[0]["text"] == alone.text
    seeded = SamplingParams(temperature=0.9, seed=3, max_tokens=5, ignore_eos=True)
    assert by[2]["token_ids"] == Driver(h).complete([5, 6, 7, 8], seeded).token_ids
    bad = tmp_path / "bad.jsonl"
    bad.write_text('hi\n{"prompt": "x", "top_p": 7}\n')
    rc = main(["generate", "--prompts-file", str(bad), *common])
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}:2: top_p" in err and "Traceback" not in err
