"""Scale-out with Ray Serve: ``poot serve --ray --replicas 2`` on a local Ray instance brings
up two engine replicas of the tiny fixture behind one ingress; chat completions through it
with the ``openai`` client (streaming and not) equal the engine's output, concurrent
requests are spread over both replicas, and SIGTERM shuts Ray down and exits 0."""

from __future__ import annotations

import concurrent.futures
import shutil
import socket
import tempfile
import time

import httpx
import openai
import pytest

from server_util import TINY_CONTEXT
from proc_util import ServeProcess

pytest.importorskip("ray.serve", reason="needs the ray extra (pip install -e \".[ray]\")")

MSG = [{"role": "user", "content": "hello there"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_behind_one_ingress(tiny_path, tiny):
    port = _free_port()
    # Ray's socket paths must stay under 108 bytes: a short temporary folder
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    p = ServeProcess("--ray", "--replicas", "2", "--model", str(tiny_path), "--kv-capacity",
                     str(TINY_CONTEXT), "--max-batch", "2", "--prefill-chunk", "16",
                     "--no-warm-up", "--served-model-name", "tiny", "--port", str(port),
                     env={"RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmp})
    url = f"http://127.0.0.1:{port}"
    try:
        p.wait_for(r"ready: 2 replica", 600)
        end = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, p.log[-3000:]
            time.sleep(0.5)
        from poot.sampling_params import SamplingParams

        want = list(tiny.engine.generate(tiny.encode(MSG), SamplingParams(
            temperature=0, max_tokens=16, ignore_eos=True)))[-1].output_text
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw = dict(model="tiny", messages=MSG, temperature=0, max_tokens=16,
                  extra_body={"ignore_eos": True})

        def one(i):
            raw = c.chat.completions.with_raw_response.create(**kw)
            return raw.headers.get("x-poot-replica"), raw.parse().choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(one, range(16)))
        assert all(text == want for _, text in got)
        assert len({rep for rep, _ in got}) == 2          # both replicas served
        chunks = list(c.chat.completions.create(stream=True, **kw))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
        assert [m.id for m in c.models.list().data] == ["tiny"]
        code = p.terminate(180)
        assert code == 0, p.log[-3000:]
    finally:
        p.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
