"""The plugin as installed: its entry point, and registration that pulls in no kernel library."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys


def test_entry_point_is_installed():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="infer_core.plugins")}
    assert "flash" in eps, "pip install -e plugins/attention_flash registers the 'flash' entry point"
    assert eps["flash"].value == "infer_attention_flash.plugin"
    assert eps["flash"].dist.metadata["Name"] == "infer-attention-flash"


def _modules_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it must print a JSON object."""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_registering_imports_neither_flash_attn_nor_the_backend():
    found = _modules_after(
        "import json, sys\n"
        "from infer_core.loader import load_catalog\n"
        "impl = load_catalog().get('attention', 'flash')\n"
        "print(json.dumps({'impl': [impl.name, impl.distribution, impl.class_path],\n"
        "                  'flash_attn': 'flash_attn' in sys.modules,\n"
        "                  'backend': 'infer_attention_flash.backend' in sys.modules,\n"
        "                  'plugin': 'infer_attention_flash.plugin' in sys.modules}))\n"
    )
    assert found["impl"] == ["flash", "infer-attention-flash", "infer_attention_flash.backend:FlashAttentionBackend"]
    assert found["plugin"], "the catalog should have loaded the plugin module through its entry point"
    assert not found["flash_attn"] and not found["backend"]


def test_backend_module_and_validate_import_no_flash_attn():
    """The loader imports the backend class to ask validate(); that must work without flash_attn."""
    found = _modules_after(
        "import json, sys\n"
        "import infer_attention_flash.plugin\n"
        "from infer_attention_flash.backend import FlashAttentionBackend\n"
        "print(json.dumps({'flash_attn': 'flash_attn' in sys.modules,\n"
        "                  'validate': callable(FlashAttentionBackend.validate)}))\n"
    )
    assert found == {"flash_attn": False, "validate": True}


def test_aliases_resolve_to_flash():
    from infer_core.loader import load_catalog

    catalog = load_catalog()
    assert catalog.get("attention", "flash-attn") is catalog.get("attention", "flash")
    assert catalog.get("attention", "FLASH_ATTN") is catalog.get("attention", "flash")
