"""The embedded default model's dequantized cache: written once (also by two processes starting at
once, over a broken entry), then used; a broken or stale entry is detected; and an engine on it
answers with the GGUF path's weights, tokens and log-probabilities, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer_core.models import gguf_cache
from infer_core.models.gguf_cache import MANIFEST, WEIGHTS, cached_checkpoint, entry_problem, gguf_sha256
from infer_core.models.gguf_cache import locate_model
from infer_core.models.source import default_model_source

_START = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from infer_core.models.gguf_cache import locate_model
print(locate_model(None, "auto", sys.argv[1]).path)
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """(root, entry, each process's log): two processes start at once over a partial entry (a folder
    without its manifest, as a writer that renamed without one would leave)."""
    root = tmp_path_factory.mktemp("infer-cache")
    entry = root / gguf_sha256(default_model_source().gguf_path)
    entry.mkdir()
    (entry / WEIGHTS).write_bytes(b"half a file")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _START, str(root)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert Path(out.strip()) == entry
    return root, entry, [err for _, err in outputs]


def test_two_starts_at_once_write_one_entry_over_a_broken_one(cache):
    root, entry, logs = cache
    assert entry_problem(entry, entry.name) is None
    lines = [next(line for line in log.splitlines() if "model SmolLM2-135M-Instruct: from" in line) for log in logs]
    assert sum(line.endswith(", written now") for line in lines) == 1, lines  # the other waited, then read it
    assert all(f"{entry} (the cache of " in line for line in lines)
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == [entry.name]  # no staging left
    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest["gguf_sha256"] == entry.name and {"config.json", WEIGHTS, "tokenizer.json"} <= set(manifest["files"])


def test_a_whole_entry_is_read_not_written(cache):
    root, entry, _ = cache
    before = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}
    cached, written = cached_checkpoint(default_model_source(), root)
    assert not written and cached.path == entry and cached.gguf_file is None and cached.is_default
    assert cached.dequantized_from == default_model_source().gguf_path
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == before
    assert locate_model(None, "gguf", str(root)) == default_model_source()  # the GGUF itself, when asked for


def _copy_with(entry: Path, dest: Path, name: str, content: bytes | None) -> Path:
    """``entry`` linked file by file into ``dest``, with ``name`` replaced by ``content`` (None: left out)."""
    dest.mkdir()
    for path in entry.iterdir():
        if path.name != name:
            os.link(path, dest / path.name)
        elif content is not None:
            (dest / name).write_bytes(content)
    return dest


def _same_size(path: Path, at: int, data: bytes) -> bytes:
    with open(path, "rb") as f:
        content = bytearray(f.read())
    content[at:at + len(data)] = data
    return bytes(content)


@pytest.mark.parametrize("damage", ["no_manifest", "manifest_garbage", "weights_missing", "weights_truncated",
                                    "weights_header_garbage", "tokenizer_garbage", "other_transformers", "other_format"])
def test_a_broken_or_stale_entry_is_detected(cache, tmp_path, damage):
    _, entry, _ = cache
    manifest = json.loads((entry / MANIFEST).read_text())
    weights_size = (entry / WEIGHTS).stat().st_size
    name, content, expected = {
        "no_manifest": (MANIFEST, None, "has no infer-cache.json"),
        "manifest_garbage": (MANIFEST, b"{not json", "infer-cache.json does not parse"),
        "weights_missing": (WEIGHTS, None, "model.safetensors is missing"),
        "weights_truncated": (WEIGHTS, b"\0" * (weights_size // 2), f"not the {weights_size} written"),
        "weights_header_garbage": (WEIGHTS, None, "model.safetensors does not parse"),
        "tokenizer_garbage": ("tokenizer.json", None, "tokenizer.json does not parse"),
        "other_transformers": (MANIFEST, json.dumps({**manifest, "transformers": "4.0.0"}).encode(),
                               "written for transformers '4.0.0'"),
        "other_format": (MANIFEST, json.dumps({**manifest, "format": 0}).encode(), "written for format 0"),
    }[damage]
    if damage == "weights_header_garbage":
        content = _same_size(entry / WEIGHTS, 8, b"garbage!")
    if damage == "tokenizer_garbage":
        content = _same_size(entry / "tokenizer.json", 0, b"]")
    broken = _copy_with(entry, tmp_path / entry.name, name, content)
    assert expected in (entry_problem(broken, entry.name) or "")


def test_an_unwritable_cache_reads_the_gguf(tmp_path, caplog):
    (tmp_path / "a-file").write_text("")
    with caplog.at_level("WARNING", logger="infer_core.models.gguf_cache"):
        source = locate_model(None, "auto", str(tmp_path / "a-file" / "infer"))
    assert source == default_model_source()
    assert "cannot be cached in" in caplog.text and "INFER_CACHE_DIR" in caplog.text


def test_default_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert gguf_cache.default_cache_root() == tmp_path / "infer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert gguf_cache.default_cache_root() == Path.home() / ".cache" / "infer"


PROMPTS = [[{"role": "user", "content": "What is the capital of France?"}],
           [{"role": "user", "content": "Écris un haïku sur la mer, s'il te plaît. 日本語も少し。"}]]


def test_the_cache_answers_as_the_gguf_does(cache):
    """Same config, weights (bit for bit), tokenizer, greedy tokens and top-5 log-probabilities."""
    import torch

    from infer_core import LLM, SamplingParams

    root, entry, _ = cache
    from_gguf = LLM(load_format="gguf", cache_dir=str(root))
    from_cache = LLM(cache_dir=str(root))
    try:
        assert from_gguf.engine.config.source.gguf_file is not None
        assert from_cache.engine.config.source.path == entry and from_cache.engine.config.load_format == "safetensors"
        assert from_cache.engine.config.model == from_gguf.engine.config.model
        assert from_cache.engine.config.eos_token_ids == from_gguf.engine.config.eos_token_ids
        weights = [dict(llm.engine.executor.worker.runner.model.state_dict()) for llm in (from_gguf, from_cache)]
        assert weights[0].keys() == weights[1].keys()
        assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
        tokenizers = [llm.get_tokenizer() for llm in (from_gguf, from_cache)]
        for text in ("Hello world", "  two spaces\n\nand lines", "naïve café 日本語", "<|im_end|>x"):
            assert tokenizers[0](text).input_ids == tokenizers[1](text).input_ids
        for messages in PROMPTS:
            chat = [t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) for t in tokenizers]
            assert chat[0] == chat[1]
        assert tokenizers[0].all_special_ids == tokenizers[1].all_special_ids
        assert tokenizers[0].decode(range(300, 400)) == tokenizers[1].decode(range(300, 400))

        params = SamplingParams(temperature=0, max_tokens=24, logprobs=5)
        outputs = [llm.chat(PROMPTS, params, use_tqdm=False) for llm in (from_gguf, from_cache)]
        for a, b in zip(*outputs):
            assert a.prompt_token_ids == b.prompt_token_ids
            assert a.outputs[0].token_ids == b.outputs[0].token_ids and a.outputs[0].text == b.outputs[0].text
            assert a.outputs[0].logprobs == b.outputs[0].logprobs
        assert "Paris" in outputs[1][0].outputs[0].text
    finally:
        from_gguf.shutdown()
        from_cache.shutdown()
