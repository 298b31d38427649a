"""``poot embed``: JSON embeddings equal to the recorded sentence-transformers ones, cross-encoder
scores sorted, and option errors as one ``poot: error:`` line with status 2."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest

from model_steps import FIXTURES, fixture_path, reference
from poot.cli import main


def _run(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["embed", *argv, "--quiet"])
    return rc, out.getvalue()


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path_factory):
    """CI's compile cache when set (shared with the other tests), else a temp one."""
    if not os.environ.get("POOT_CACHE_DIR"):
        monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "embed-cli"))


def test_embed_texts_and_ids_equal_reference():
    meta = json.loads((FIXTURES / "bert_embed" / "reference.json").read_text())
    ref = reference("bert_embed")
    rc, out = _run(["--model", str(fixture_path("bert_embed")), "--max-tokens", "16",
                    *meta["texts"]])
    assert rc == 0
    got = json.loads(out)
    assert (got["pooling"], got["normalize"], got["dim"]) == ("mean", True, 64)
    assert np.abs(np.array(got["embeddings"]) - ref["text_embeddings"]).max() < 1e-4
    ids = " ".join(str(i) for i in ref["input_ids"][1][:ref["lengths"][1]])
    rc, out = _run(["--model", str(fixture_path("bert_embed")), "--max-tokens", "16",
                    "--ids", ids])
    assert rc == 0
    assert np.abs(np.array(json.loads(out)["embeddings"][0]) - ref["embeddings"][1]).max() < 1e-4


def test_query_scores_documents_sorted():
    meta = json.loads((FIXTURES / "bert_cross_encoder" / "reference.json").read_text())
    want = reference("bert_cross_encoder")["rerank_scores"]
    rc, out = _run(["--model", str(fixture_path("bert_cross_encoder")), "--max-tokens", "32",
                    "--query", meta["rerank_query"], *meta["rerank_documents"]])
    assert rc == 0
    res = json.loads(out)["results"]
    assert [r["index"] for r in res] == list(np.argsort(-want, kind="stable"))
    assert max(abs(r["relevance_score"] - want[r["index"]]) for r in res) < 1e-4


@pytest.mark.parametrize("argv,says", [
    (["--ids", "1 x 3"], "--ids needs token ids"),
    (["--ids", "1 2 999"], "outside the vocabulary"),
    (["--max-tokens", "0", "hi"], "--max-tokens"),
    (["--query", "q", "doc"], "needs a cross-encoder"),
    ([], "at least one input"),
])
def test_errors_are_one_line(argv, says, capsys):
    rc, _ = _run(["--model", str(fixture_path("bert_embed")), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("poot: error:") and says in err[0]
