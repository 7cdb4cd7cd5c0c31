"""EngineSettings precedence, validation messages, and `infer config` showing where values came from."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infer_core.errors import SettingsError
from infer_core.settings import describe_sources, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no stray .env
    for key in list(__import__("os").environ):
        if key.startswith("INFER_"):
            monkeypatch.delenv(key)


def test_precedence_argument_env_dotenv_default(monkeypatch, tmp_path):
    (tmp_path / ".env").write_text("INFER_MAX_NUM_SEQS=3\nINFER_BLOCK_SIZE=32\nINFER_SEED=9\n")
    monkeypatch.setenv("INFER_MAX_NUM_SEQS", "5")
    monkeypatch.setenv("INFER_BLOCK_SIZE", "64")
    settings = load_settings(max_num_seqs=7)
    assert settings.max_num_seqs == 7  # argument beats environment
    assert settings.block_size == 64  # environment beats .env
    assert settings.seed == 9  # .env beats default
    assert settings.max_num_batched_tokens == 8192  # default
    sources = {name: source for name, _, source in describe_sources(settings, {"max_num_seqs": 7})}
    assert sources["max_num_seqs"] == "argument"
    assert sources["block_size"] == "env INFER_BLOCK_SIZE"
    assert sources["seed"] == ".env INFER_SEED"
    assert sources["max_num_batched_tokens"] == "default"


def test_invalid_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("INFER_GPU_MEMORY_UTILIZATION", "1.5")
    with pytest.raises(SettingsError, match=r"INFER_GPU_MEMORY_UTILIZATION / gpu_memory_utilization: Input should "
                                            r"be less than or equal to 1 \(got '1.5'\)"):
        load_settings()


def test_unknown_keyword_and_dotenv_entry(tmp_path):
    with pytest.raises(SettingsError, match=r"'max_num_seq' is not a setting; did you mean max_num_seqs\?"):
        load_settings(max_num_seq=4)
    (tmp_path / ".env").write_text("INFER_DTYPPE=bfloat16\n")
    with pytest.raises(SettingsError, match=r"INFER_DTYPPE is not a setting; did you mean INFER_DTYPE\? \(from the \.env\)"):
        load_settings()


def test_aliases_and_lists(monkeypatch):
    monkeypatch.setenv("INFER_DTYPE", "bf16")
    monkeypatch.setenv("INFER_PLUGINS", "triton, flash")
    settings = load_settings()
    assert settings.dtype == "bfloat16" and settings.plugins == ["triton", "flash"]


def test_infer_config_prints_values_and_sources(monkeypatch):
    monkeypatch.setenv("INFER_MAX_MODEL_LEN", "2048")
    monkeypatch.setenv("INFER_API_KEY", "secret-key")
    out = subprocess.run([sys.executable, "-m", "infer_core.cli", "config", "--max-num-seqs", "12"],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert "12" in rows["max_num_seqs"] and rows["max_num_seqs"].endswith("(argument)")
    assert "2048" in rows["max_model_len"] and rows["max_model_len"].endswith("(env INFER_MAX_MODEL_LEN)")
    assert rows["scheduler"].endswith("(default)") and "fcfs" in rows["scheduler"]
    assert "secret-key" not in out and "***" in rows["api_key"]
