"""PluginSettings: the settings a plugin declares, read exactly as the engine's own.

A plugin subclasses ``PluginSettings`` with typed, defaulted, described fields (validators
welcome) and declares it from its hook module::

    class SpecSettings(PluginSettings):
        section = "speculative decoding"
        num_speculative_tokens: int = Field(4, ge=1, title="draft tokens a step",  # one line of --help
                                            description="tokens the draft model proposes each step")

    @hookimpl
    def register_settings(register):
        register(SpecSettings)

Every field is then a setting like the core's: ``INFER_NUM_SPECULATIVE_TOKENS``, ``.env``,
``--num-speculative-tokens``, ``LLM(num_speculative_tokens=...)``, with the same precedence,
validation messages and ``infer config`` provenance. Names are flat (no prefix is added), so a
plugin's names must not collide with the core's or another plugin's; the loader says which do.

The plugin reads its values through the class: ``SpecSettings.of(engine_settings)``.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "INFER_"

# The core's EngineSettings and every PluginSettings read their sources the same way.
SETTINGS_CONFIG = SettingsConfigDict(
    env_prefix=ENV_PREFIX,
    env_nested_delimiter="__",
    env_file=".env",
    extra="ignore",  # unknown names are rejected with a suggestion by infer_core.settings.check_names
    validate_default=True,
    protected_namespaces=(),
)

S = TypeVar("S", bound="PluginSettings")


class PluginSettings(BaseSettings):
    """The base of a plugin's settings class; its fields are settings named like the core's.

    Subclasses live at the top level of an importable module: the engine's settings carry an
    instance to every worker process, pickled by reference to its class.
    """

    model_config = SETTINGS_CONFIG

    section: ClassVar[str] = ""  # title of its group of flags in ``--help``; "" = the plugin's name

    @classmethod
    def of(cls: type[S], settings: Any) -> S:
        """This class's values in ``settings`` (an ``infer_core.settings.EngineSettings``)."""
        return settings.plugin(cls)
