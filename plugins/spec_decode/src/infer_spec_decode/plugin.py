"""Registers the ``ngram`` and ``draft`` decoding policies and the plugin's settings; importing this module imports neither
torch nor the policy (``settings`` needs pydantic only)."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

from infer_spec_decode.settings import SpecDecodeSettings


@hookimpl
def register_settings(register):
    register(SpecDecodeSettings)


@hookimpl
def register_decoding_policies(register):
    register("ngram", "infer_spec_decode.ngram_policy:NgramDecoding", aliases=("prompt_lookup",))
    register("draft", "infer_spec_decode.draft_policy:DraftDecoding", aliases=("draft_model",))
