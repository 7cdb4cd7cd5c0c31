"""Errors a user can cause. Each message says what was wrong and what to do about it."""

from __future__ import annotations


class InferError(Exception):
    """Base class of every error infer raises on purpose."""


class SettingsError(InferError, ValueError):
    """A setting (argument, INFER_* variable or .env entry) is unknown or has a bad value."""


class PluginError(InferError):
    """An implementation was asked for that is not installed or cannot run here."""


class ModelError(InferError, ValueError):
    """The model cannot be found, read or built."""


class RequestError(InferError, ValueError):
    """A request cannot be served (too long, larger than the KV pool, empty, …)."""

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class EngineDeadError(InferError, RuntimeError):
    """The engine (or one of its worker processes) died; it must be restarted."""
