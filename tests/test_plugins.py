"""Plugins found through entry points: listed, selectable by INFER_*, lazily imported, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from infer_core import LLM, SamplingParams
from infer_core.errors import PluginError, SettingsError
from infer_core.loader import load_catalog
from infer_core.testing import install_plugin_package

PLUGIN = textwrap.dedent('''
    from infer_core.hookspecs import hookimpl

    @hookimpl
    def register_attention_backends(register):
        register("counting", "infer_test_plugin.backends:CountingAttention", aliases=("count",))
        register("gpu-only", "infer_test_plugin.backends:GpuOnlyAttention")
        register("heavy", "infer_test_plugin.heavy:HeavyAttention")
''')

BACKENDS = textwrap.dedent('''
    from infer_core.builtin.attention_torch import TorchAttentionBackend
    from infer_core.interfaces import AttentionBackend

    class CountingAttention(TorchAttentionBackend):
        """The torch backend, counting its forward calls (so a test sees it was used)."""
        forward_calls = 0

        def forward(self, *args):
            CountingAttention.forward_calls += 1
            return super().forward(*args)

    class GpuOnlyAttention(AttentionBackend):
        @classmethod
        def validate(cls, ctx):
            return ["it needs the imaginary GPU library (pip install imaginary-gpu)", "CUDA is not available"]

        def forward(self, *args):
            raise AssertionError("never selected")
''')

HEAVY = "raise ImportError('the heavy kernel library is not installed')\n"


def install_plugin(root, name: str = "infer-test-plugin", entry: str = "counting-plugin", version: str = "0.3.0"):
    """A real installed distribution: package + .dist-info with an entry point, on sys.path."""
    package = name.replace("-", "_")
    files = {"plugin.py": PLUGIN.replace("infer_test_plugin", package), "backends.py": BACKENDS, "heavy.py": HEAVY}
    return install_plugin_package(root, name, entry, package, files, version)


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    root = install_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    for module in [m for m in sys.modules if m.startswith("infer_test_plugin")]:
        del sys.modules[module]
    return root


def test_registered_without_importing_the_implementation(plugin_path):
    catalog = load_catalog()
    impl = catalog.get("attention", "heavy")
    assert impl.distribution == "infer-test-plugin" and impl.version == "0.3.0"
    assert "infer_test_plugin.heavy" not in sys.modules and "infer_test_plugin.backends" not in sys.modules
    assert catalog.get("attention", "count") is catalog.get("attention", "counting")


def test_selected_by_environment_and_used(plugin_path, tiny_checkpoint, monkeypatch):
    folder = str(tiny_checkpoint("llama"))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    reference = LLM(folder, attention="torch").generate([[5, 6, 7, 8]], params, use_tqdm=False)
    monkeypatch.setenv("INFER_ATTENTION", "counting")
    llm = LLM(folder)
    assert llm.engine.spec.chosen["attention"].distribution == "infer-test-plugin"
    backends = sys.modules["infer_test_plugin.backends"]
    before = backends.CountingAttention.forward_calls
    outputs = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
    assert backends.CountingAttention.forward_calls > before
    assert outputs[0].outputs[0].token_ids == reference[0].outputs[0].token_ids


def test_infer_plugins_lists_it(plugin_path, tiny_checkpoint):
    env = {**os.environ, "PYTHONPATH": f"{plugin_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run([sys.executable, "-m", "infer_core.cli", "plugins", "--model", str(tiny_checkpoint("llama"))],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "counting-plugin (infer-test-plugin 0.3.0)" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("counting"))
    assert "infer-test-plugin 0.3.0" in line and "can run" in line and "alias count" in line
    gpu_line = next(line for line in out.splitlines() if "gpu-only" in line)
    assert "cannot run: it needs the imaginary GPU library" in gpu_line
    heavy_line = next(line for line in out.splitlines() if line.strip().startswith("heavy"))
    assert "cannot run" in heavy_line and "the heavy kernel library is not installed" in heavy_line
    assert "* torch" in out  # still the default here


def test_unknown_name_lists_installed_and_suggests(plugin_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("INFER_PLUGINS", "counting-plugin")  # the list is exact: leave out other installed plugins
    monkeypatch.setenv("INFER_ATTENTION", "countign")
    with pytest.raises(PluginError) as error:
        LLM(str(tiny_checkpoint("llama")))
    assert str(error.value) == (
        "INFER_ATTENTION='countign' is not installed. Installed attention backends: counting (infer-test-plugin "
        "0.3.0), gpu-only (infer-test-plugin 0.3.0), heavy (infer-test-plugin 0.3.0), torch (infer-core). "
        "Did you mean 'counting'?"
    )


def test_implementation_that_cannot_run_gives_reasons(plugin_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("INFER_PLUGINS", "counting-plugin")  # the list is exact: leave out other installed plugins
    with pytest.raises(PluginError) as error:
        LLM(str(tiny_checkpoint("llama")), attention="gpu-only")
    assert str(error.value) == (
        "attention 'gpu-only' cannot run here: it needs the imaginary GPU library (pip install imaginary-gpu); "
        "CUDA is not available. Attention backends that can run here: counting, torch."
    )


def test_allow_list_restricts_entry_points(plugin_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("INFER_PLUGINS", "")
    assert load_catalog(plugins_allowed()).get("attention", "counting") is None
    monkeypatch.setenv("INFER_PLUGINS", "counting-plugin")
    assert load_catalog(plugins_allowed()).get("attention", "counting") is not None
    monkeypatch.setenv("INFER_PLUGINS", "no-such-plugin")
    with pytest.raises(SettingsError, match=r"INFER_PLUGINS names no-such-plugin, which is not installed; "
                                            r"installed plugins: .*counting-plugin"):
        LLM(str(tiny_checkpoint("llama")))


def plugins_allowed():
    from infer_core.settings import load_settings

    return load_settings().plugins


def test_same_name_from_two_distributions_is_an_error(plugin_path, tmp_path, monkeypatch):
    second = install_plugin(tmp_path / "site2", name="infer-other-plugin", entry="other-plugin", version="1.0")
    monkeypatch.syspath_prepend(str(second))
    with pytest.raises(PluginError) as error:
        load_catalog()
    message = str(error.value)
    assert message.startswith("attention 'counting' is registered twice: by infer-")
    assert "infer-test-plugin" in message and "infer-other-plugin" in message
    assert message.endswith("uninstall one or restrict INFER_PLUGINS")


def test_misspelled_variable_is_rejected_with_a_suggestion(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("INFER_ATTENTON", "torch")
    with pytest.raises(SettingsError, match=r"^INFER_ATTENTON is not a setting; did you mean INFER_ATTENTION\?"):
        LLM(str(tiny_checkpoint("llama")))


def test_unsupported_architecture_lists_the_supported(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(PluginError, match=r"architecture 'GPT2LMHeadModel' is not supported. Supported model "
                                          r"architectures: LlamaForCausalLM \(infer-core\), MistralForCausalLM"):
        LLM(str(tmp_path), load_format="dummy")


RING_PLUGIN = textwrap.dedent('''
    from infer_core.hookspecs import hookimpl


    @hookimpl
    def register_parallel_strategies(register):
        register("ring", "infer_ring_plugin.strategy:RingStrategy")


    @hookimpl
    def default_parallel_strategy(ctx):
        return "ring" if ctx.settings.tensor_parallel_size == 3 else None
''')


def test_the_default_parallel_strategy_comes_from_the_plugins(tmp_path, tiny_checkpoint, monkeypatch):
    from infer_core.loader import choose_names
    from infer_core.models.source import read_model_config, resolve_model_source
    from infer_core.platform import make_runtime_context
    from infer_core.settings import load_settings

    root = install_plugin_package(tmp_path / "site", "infer-ring-plugin", "ring", "infer_ring_plugin",
                                  {"plugin.py": RING_PLUGIN})
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("INFER_PLUGINS", "ring")  # the list is exact: leave out other installed plugins
    folder = str(tiny_checkpoint("llama"))

    def chosen(**settings_kwargs) -> str:
        settings = load_settings(model=folder, **settings_kwargs)
        ctx = make_runtime_context(settings, read_model_config(resolve_model_source(folder)))
        return choose_names(settings, load_catalog(settings.plugins), ctx)["parallel"]

    assert chosen() == "single"  # the core's answer for one device
    assert chosen(tensor_parallel_size=3) == "ring"  # the plugin's
    assert chosen(tensor_parallel_size=3, parallel="single") == "single"  # the setting beats the rule
    with pytest.raises(PluginError) as error:
        chosen(tensor_parallel_size=2)
    assert str(error.value) == (
        "INFER_TENSOR_PARALLEL_SIZE=2 needs a parallel strategy for several devices, and no loaded plugin offers one "
        "(plugins loaded: builtin, ring). Install infer-parallel-tp (pip install -e plugins/parallel_tp) and leave "
        "'tp' in INFER_PLUGINS, name a strategy in INFER_PARALLEL, or set INFER_TENSOR_PARALLEL_SIZE=1"
    )
    with pytest.raises(PluginError, match=r"^INFER_TENSOR_PARALLEL_SIZE=2 needs a parallel strategy .* \(plugins "
                                          r"loaded: builtin\)\. Install infer-parallel-tp"):
        LLM(folder, plugins="", tensor_parallel_size=2)  # before any worker starts
