"""The `infer` command as a user runs it: the commands that load a model in a process of their own; those that
end before any model loads (errors, --help, plugins) by calling its entry point, ``infer_core.cli:main``, here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from infer_core.settings import EngineSettings


def run_infer(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    executable = shutil.which("infer")
    command = [executable, *args] if executable else [sys.executable, "-m", "infer_core.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def main_here(capsys, *args: str) -> tuple[int, str, str]:
    """``infer ARGS`` run by its entry point in this process: (exit code, stdout, stderr)."""
    from infer_core.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's --help and usage errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_chat_with_the_default_model():
    result = run_infer("generate", "--chat", "What is the capital of France?", "--max-tokens", "24")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_errors_are_one_line_and_exit_2(capsys):
    code, _, err = main_here(capsys, "generate", "hi", "--attention", "trtion")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: INFER_ATTENTION='trtion' is not installed.")


def test_plugins_lists_every_kind(capsys):
    code, out, err = main_here(capsys, "plugins")
    assert code == 0, err
    for label in ("attention backends:", "KV allocators:", "schedulers:", "quantizers:", "parallel strategies:",
                  "decoding policies:", "model architectures:"):
        assert label in out
    assert "* torch" in out and "* LlamaForCausalLM" in out


def test_bad_sampling_values_fail_before_the_model_loads(capsys, tmp_path):
    # a model that cannot load: its error would come instead had the model been loaded first
    code, _, err = main_here(capsys, "generate", "hi", "--temperature", "-1", "--model", str(tmp_path / "no-model"))
    assert code == 2
    assert err.strip().splitlines() == ["error: temperature must be >= 0, got -1.0"]


def test_interactive_chat_keeps_the_conversation():
    executable = shutil.which("infer")
    command = [executable] if executable else [sys.executable, "-m", "infer_core.cli"]
    result = subprocess.run([*command, "--log-level", "WARNING", "chat", "--max-tokens", "24"],
                            input="What is the capital of France?\nAnd of Italy?\n\n", capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    answers = [line.removeprefix("> ") for line in result.stdout.splitlines() if line.strip("> ")]
    assert len(answers) == 2 and "Paris" in answers[0] and "Rome" in answers[1]


def test_help_has_every_setting_and_no_figures(capsys):
    """Every setting is a flag (the installed plugins' too, in groups of their own); no timings in the help."""
    from infer_core.cli import SERVER_ONLY
    from infer_core.plugin_settings import declare_settings

    sections = declare_settings(None, EngineSettings.model_fields)
    for command, server in (("serve", True), ("generate", False)):
        code, out, err = main_here(capsys, command, "--help")
        assert code == 0, err
        assert not re.search(r"\d\s*(ms|µs|us)\b", out), out
        names = [n for n in EngineSettings.model_fields if server or n not in SERVER_ONLY]
        for name in names + [n for section in sections for n in section.names]:
            assert f"--{name.replace('_', '-')}" in out, name
        for section in sections:
            assert f"{section.title} (plugin {section.plugin}; also INFER_<NAME> variables):" in out
