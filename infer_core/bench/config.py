"""What ``infer bench serve`` sends: its configuration, prompts per phase, and request bodies."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from infer_core.bench.load import LoadPoint
from infer_core.bench.prompts import (
    Prompt,
    random_token_prompts,
    random_word_prompts,
    take_prompts,
)
from infer_core.errors import InferError

Endpoint = Literal["completions", "chat"]
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class BenchmarkError(InferError):
    """The benchmark cannot run as asked: bad flags, or the server cannot be used."""


@dataclass(slots=True)
class ServeBenchConfig:
    """What to send, where, and under which offered loads (one run per concurrency or rate)."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    endpoint: Endpoint = "completions"
    num_prompts: int = 100
    input_len: int = 512
    output_len: int = 128
    prompts_file: str | None = None
    concurrency: list[int] = field(default_factory=list)
    request_rate: list[float] = field(default_factory=list)
    seed: int = 0
    ignore_eos: bool = True
    temperature: float = 0.0
    warmup: int = 1
    timeout_s: float = 600.0
    wait_ready_s: float = 0.0
    label: str | None = None
    show_progress: bool = True
    server_flags: list[str] | None = None  # start `infer serve` with these (base_url is then its own)
    offline_row: bool = False  # then the offline engine on the last load point's prompts

    def load_points(self) -> list[LoadPoint]:
        if self.concurrency and self.request_rate:
            raise BenchmarkError("give --concurrency or --request-rate, not both")
        if self.concurrency:
            return [LoadPoint(concurrency=c) for c in self.concurrency]
        return [LoadPoint(request_rate=r) for r in self.request_rate or [math.inf]]

    def check(self) -> None:
        """Raise BenchmarkError naming the first bad value."""
        for name in ("num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise BenchmarkError(f"--{name.replace('_', '-')} must be >= 1")
        if not self.timeout_s > 0 or self.wait_ready_s < 0:
            raise BenchmarkError("--timeout must be > 0 and --wait-ready >= 0")
        if self.warmup < 0:
            raise BenchmarkError("--warmup must be >= 0")
        if self.endpoint not in ENDPOINT_PATHS:
            raise BenchmarkError(
                f"--endpoint must be one of {sorted(ENDPOINT_PATHS)}, got {self.endpoint!r}"
            )
        if any(c < 1 for c in self.concurrency):
            raise BenchmarkError("every --concurrency value must be >= 1")
        if any(not r > 0 for r in self.request_rate):
            raise BenchmarkError(
                "every --request-rate value must be > 0 (inf = all at once)"
            )
        if self.offline_row and self.server_flags is None:
            raise BenchmarkError(
                "--offline-row runs the offline engine with the server's engine settings, on the device the "
                "server holds while it runs: let this command start and stop the server, with "
                '--start-server "<infer serve flags>" instead of --base-url'
            )
        if self.server_flags is None and not self.base_url.startswith(("http://", "https://")):
            raise BenchmarkError(
                f"--base-url must start with http:// or https://, got {self.base_url!r}"
            )
        self.load_points()


def normalize_base_url(base_url: str) -> str:
    """``http://host:8000``, also when given with a trailing ``/`` or ``/v1``."""
    base = base_url.rstrip("/")
    return base.removesuffix("/v1")


def build_payload(
    config: ServeBenchConfig, model: str, prompt: Prompt
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": config.output_len,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.endpoint == "chat":
        if not isinstance(prompt, str):
            raise BenchmarkError(
                "chat prompts must be text; use --endpoint completions for token ids"
            )
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if config.ignore_eos:
        payload["ignore_eos"] = True
    return payload


def make_prompts(
    config: ServeBenchConfig, num_prompts: int, tag: str, pool: list[Prompt] | None
) -> list[Prompt]:
    """Prompts of one phase (warm-up, or a load point).

    Random prompts are drawn afresh per phase so that no phase hits the prefix cache that an
    earlier phase filled; a prompts file gives every phase the same prompts, from its start.
    """
    if pool is not None:
        return take_prompts(pool, num_prompts)
    rng = random.Random(f"prompts-{config.seed}-{tag}")
    if config.endpoint == "chat":
        return list(random_word_prompts(num_prompts, config.input_len, rng))
    return list(random_token_prompts(num_prompts, config.input_len, rng))


def workload_settings(config: ServeBenchConfig) -> dict[str, Any]:
    """The ``settings`` of the record: what was sent, not where (rows name model and URL)."""
    if config.prompts_file:
        prompts = config.prompts_file
    elif config.endpoint == "chat":
        prompts = "random words"
    else:
        prompts = "random token ids in [1000, 10000)"
    loads = config.load_points()
    return {
        "endpoint": config.endpoint,
        "num_prompts": config.num_prompts,
        "input_len": None if config.prompts_file else config.input_len,
        "output_len": config.output_len,
        "prompts": prompts,
        "concurrency": [p.concurrency for p in loads],
        "request_rate": [
            p.request_rate if math.isfinite(p.request_rate) else "inf" for p in loads
        ],
        "seed": config.seed,
        "ignore_eos": config.ignore_eos,
        "temperature": config.temperature,
        "warmup": config.warmup,
    }
