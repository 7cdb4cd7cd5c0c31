"""EngineSettings precedence, validation messages, and `infer config` showing where values came from; the same for
the settings a plugin declares, who may declare a name, and settings reaching a fresh process pickled."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from infer_core.errors import PluginError, SettingsError
from infer_core.settings import describe_sources, load_settings
from infer_core.testing import install_plugin_package


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no stray .env
    for key in list(os.environ):
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
    assert settings.max_num_batched_tokens is None  # default: the device's (test_device_defaults)
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


def test_infer_config_prints_values_and_sources(monkeypatch, draft_plugin):
    monkeypatch.setenv("INFER_MAX_MODEL_LEN", "2048")
    monkeypatch.setenv("INFER_API_KEY", "secret-key")
    monkeypatch.setenv("INFER_DRAFT_MODEL_FOLDER", "/models/draft")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(draft_plugin), *sys.path])}
    out = subprocess.run([sys.executable, "-m", "infer_core.cli", "config", "--max-num-seqs", "12",
                          "--num-draft-tokens", "9"], capture_output=True, text=True, check=True, env=env).stdout
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert "12" in rows["max_num_seqs"] and rows["max_num_seqs"].endswith("(argument)")
    assert "2048" in rows["max_model_len"] and rows["max_model_len"].endswith("(env INFER_MAX_MODEL_LEN)")
    assert rows["scheduler"].endswith("(default)") and "fcfs" in rows["scheduler"]
    assert "secret-key" not in out and "***" in rows["api_key"]
    # unset for a default rule: what the rule picks here, marked as the rule's
    assert "SmolLM2-135M-Instruct (" in rows["model"] and ".gguf)" in rows["model"]
    assert rows["model"].endswith("(default rule: the embedded default model)")
    assert rows["attention"].split()[1] != "None"
    assert rows["attention"].endswith("(default rule: the best backend that can run here)")
    assert rows["parallel"].split()[1] == "single" and rows["quantization"].split()[1] == "none"
    # unset for the device: what this machine (a CPU here, a GPU elsewhere) resolves them to
    assert rows["max_num_batched_tokens"].split()[1] in ("2048", "8192")
    assert rows["max_num_batched_tokens"].endswith("(default rule: the device's: 8192 on a GPU, 2048 on the CPU)")
    assert rows["async_scheduling"].split()[1] in ("False", "True")
    # a plugin's settings: value, source and the plugin that declared them
    assert rows["num_draft_tokens"].split()[1] == "9"
    assert rows["num_draft_tokens"].endswith("(argument; declared by plugin draft of infer-draft 0.2.0)")
    assert rows["draft_model_folder"].endswith("(env INFER_DRAFT_MODEL_FOLDER; declared by plugin draft of "
                                              "infer-draft 0.2.0)")


# A plugin with settings of its own, installed as a real distribution (an entry point on sys.path). Its
# names are none an installed plugin declares (plugins/spec_decode declares num_speculative_tokens).
DRAFT_SETTINGS = textwrap.dedent('''
    from pydantic import Field, field_validator

    from infer_core.interfaces import PluginSettings


    class DraftSettings(PluginSettings):
        section = "speculative decoding"

        num_draft_tokens: int = Field(4, ge=1, le=16, title="draft tokens a step",
                                            description="tokens the draft model proposes each step")
        draft_model_folder: str | None = Field(None, description="the draft model's folder")

        @field_validator("draft_model_folder", mode="before")
        @classmethod
        def _blank_is_unset(cls, value):
            return None if isinstance(value, str) and not value.strip() else value
''')

DRAFT_PLUGIN = textwrap.dedent('''
    from infer_core.hookspecs import hookimpl

    from PACKAGE.settings import DraftSettings


    @hookimpl
    def register_settings(register):
        register(DraftSettings)
''')


def install_settings_plugin(root, name: str, entry: str, settings: str = DRAFT_SETTINGS, plugin: str = DRAFT_PLUGIN):
    package = name.replace("-", "_")
    files = {"plugin.py": plugin.replace("PACKAGE", package), "settings.py": settings}
    return install_plugin_package(root, name, entry, package, files, "0.2.0")


@pytest.fixture
def draft_plugin(tmp_path, monkeypatch):
    root = install_settings_plugin(tmp_path / "site", "infer-draft", "draft")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for module in [m for m in sys.modules if m.startswith(("infer_draft", "infer_rival"))]:
        del sys.modules[module]


def draft_values(settings):
    section = next(s for s in settings.declared_sections if s.plugin == "draft")
    return section.settings_class.of(settings)


def test_plugin_setting_precedence_and_provenance(draft_plugin, monkeypatch, tmp_path):
    (tmp_path / ".env").write_text("INFER_NUM_DRAFT_TOKENS=3\nINFER_DRAFT_MODEL_FOLDER=/models/draft-dotenv\n")
    monkeypatch.setenv("INFER_NUM_DRAFT_TOKENS", "5")
    values = draft_values(load_settings(num_draft_tokens=7))
    assert values.num_draft_tokens == 7  # argument beats environment
    assert values.draft_model_folder == "/models/draft-dotenv"  # .env beats default
    values = draft_values(load_settings())
    assert values.num_draft_tokens == 5  # environment beats .env
    (tmp_path / ".env").unlink()
    monkeypatch.delenv("INFER_NUM_DRAFT_TOKENS")
    settings = load_settings(max_num_seqs=2)
    assert draft_values(settings).num_draft_tokens == 4 and draft_values(settings).draft_model_folder is None
    monkeypatch.setenv("INFER_DRAFT_MODEL_FOLDER", "/models/draft")
    settings = load_settings(num_draft_tokens=6)
    rows = {name: (value, source) for name, value, source in describe_sources(settings, {"num_draft_tokens": 6})}
    assert rows["num_draft_tokens"] == (6, "argument; declared by plugin draft of infer-draft 0.2.0")
    assert rows["draft_model_folder"] == ("/models/draft", "env INFER_DRAFT_MODEL_FOLDER; declared by plugin draft of "
                                                          "infer-draft 0.2.0")
    assert rows["max_num_seqs"] == (256, "default")  # the core's rows come first, unchanged
    assert list(rows).index("max_num_seqs") < list(rows).index("num_draft_tokens")


def test_plugin_setting_validation_and_suggestions(draft_plugin, monkeypatch):
    monkeypatch.setenv("INFER_NUM_DRAFT_TOKENS", "40")
    monkeypatch.setenv("INFER_MAX_NUM_SEQS", "0")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert str(error.value) == (  # the core's and the plugin's problems, in one message and one format
        "invalid settings: INFER_MAX_NUM_SEQS / max_num_seqs: Input should be greater than or equal to 1 (got '0'); "
        "INFER_NUM_DRAFT_TOKENS / num_draft_tokens: Input should be less than or equal to 16 (got '40')"
    )
    monkeypatch.delenv("INFER_NUM_DRAFT_TOKENS")
    monkeypatch.delenv("INFER_MAX_NUM_SEQS")
    with pytest.raises(SettingsError, match=r"'num_draft_token' is not a setting; did you mean "
                                            r"num_draft_tokens\? \(settings: model, .*, "
                                            r"num_draft_tokens, draft_model_folder\b"):
        load_settings(num_draft_token=2)
    monkeypatch.setenv("INFER_DRAFT_MODEL_FOLDRE", "/models/draft")
    with pytest.raises(SettingsError, match=r"^INFER_DRAFT_MODEL_FOLDRE is not a setting; did you mean "
                                            r"INFER_DRAFT_MODEL_FOLDER\? \(from the environment\)$"):
        load_settings()


def test_a_variable_no_loaded_plugin_declares_is_an_error(draft_plugin, monkeypatch):
    monkeypatch.setenv("INFER_NUM_DRAFT_TOKENS", "2")
    assert draft_values(load_settings()).num_draft_tokens == 2
    monkeypatch.setenv("INFER_PLUGINS", "")  # the allow-list is read first: no plugin, no plugin settings
    with pytest.raises(SettingsError) as error:
        load_settings()
    message = str(error.value)
    assert message.startswith("INFER_NUM_DRAFT_TOKENS is not a setting")
    assert message.endswith("(from the environment); INFER_PLUGINS is '': a plugin it leaves out declares no settings")
    assert draft_values(load_settings(plugins="draft")).num_draft_tokens == 2  # the argument beats the variable
    monkeypatch.delenv("INFER_PLUGINS")
    monkeypatch.delenv("INFER_NUM_DRAFT_TOKENS")
    monkeypatch.setenv("INFER_NUM_DRAFT_TOKENZ", "2")
    with pytest.raises(SettingsError, match=r"^INFER_NUM_DRAFT_TOKENZ is not a setting; did you mean "
                                            r"INFER_NUM_DRAFT_TOKENS\?"):
        load_settings()


RIVAL_SETTINGS = textwrap.dedent('''
    from pydantic import Field

    from infer_core.interfaces import PluginSettings


    class RivalSettings(PluginSettings):
        NAME: int = Field(1, description="declared by a second plugin too")
''')


@pytest.mark.parametrize("name, first, fix", [
    ("num_draft_tokens", "plugin draft of infer-draft 0.2.0", "; uninstall one or restrict INFER_PLUGINS"),
    ("max_num_seqs", "infer-core (the engine's own settings)",
     "; uninstall that plugin or leave it out of INFER_PLUGINS"),
])
def test_a_name_declared_twice_names_both(draft_plugin, tmp_path, monkeypatch, name, first, fix):
    rival = install_settings_plugin(tmp_path / "site2", "infer-rival", "rival",
                                    settings=RIVAL_SETTINGS.replace("NAME", name),
                                    plugin=DRAFT_PLUGIN.replace("DraftSettings", "RivalSettings"))
    monkeypatch.syspath_prepend(str(rival))
    with pytest.raises(PluginError) as error:
        load_settings()
    message = str(error.value)  # which plugin comes first follows the order of sys.path
    assert message.startswith(f"setting {name!r} is declared twice: by ")
    assert f"by {first}" in message and "by plugin rival of infer-rival 0.2.0" in message
    assert message.endswith(fix)
    monkeypatch.setenv("INFER_PLUGINS", "draft")  # the fix the message gives
    assert load_settings().max_num_seqs == 256


def test_a_settings_class_made_at_run_time_is_refused(draft_plugin, tmp_path, monkeypatch):
    made = textwrap.dedent('''
        from pydantic import create_model

        from infer_core.interfaces import PluginSettings

        MadeSettings = create_model("Made", __base__=PluginSettings, made_setting=(int, 1))
    ''')
    rival = install_settings_plugin(tmp_path / "site2", "infer-rival", "rival", settings=made,
                                    plugin=DRAFT_PLUGIN.replace("DraftSettings", "MadeSettings"))
    monkeypatch.syspath_prepend(str(rival))
    with pytest.raises(PluginError, match=r"plugin rival \(infer-rival\) registered settings class "
                                          r"infer_rival\.settings\.Made, which cannot be imported by that name"):
        load_settings()


def test_engine_config_with_plugin_settings_unpickles_in_a_fresh_process(draft_plugin, tiny_checkpoint, monkeypatch):
    from infer_core.config import EngineConfig
    from infer_core.models.source import read_model_config, resolve_model_source
    from infer_core.platform import make_runtime_context

    source = resolve_model_source(str(tiny_checkpoint("llama")))
    settings = load_settings(num_draft_tokens=7, max_num_seqs=3)
    config = EngineConfig(make_runtime_context(settings, read_model_config(source)), source, 16, 64)
    child = textwrap.dedent('''
        import pickle, sys

        import infer_core

        config = pickle.load(sys.stdin.buffer)
        for section in config.settings.declared_sections:
            print(section.plugin, section.settings_class.of(config.settings).model_dump())
        print("core", config.settings.max_num_seqs, config.block_size)
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(draft_plugin), *sys.path]),
           "INFER_NUM_DRAFT_TOKENS": "2"}  # the child takes the pickled values, not its environment
    out = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(config), capture_output=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert "draft {'num_draft_tokens': 7, 'draft_model_folder': None}" in lines
    assert lines[-1] == "core 3 16"


def test_device_defaults_fill_only_what_was_left_unset():
    from infer_core.platform import with_device_defaults

    unset = load_settings()
    cpu, cuda = with_device_defaults(unset, "cpu"), with_device_defaults(unset, "cuda")
    assert (cpu.max_num_batched_tokens, cpu.async_scheduling) == (2048, False)
    assert (cuda.max_num_batched_tokens, cuda.async_scheduling) == (8192, True)
    assert unset.max_num_batched_tokens is None and unset.async_scheduling is None  # the caller's are left as they were
    given = with_device_defaults(load_settings(max_num_batched_tokens=300, async_scheduling=True), "cpu")
    assert (given.max_num_batched_tokens, given.async_scheduling) == (300, True)
