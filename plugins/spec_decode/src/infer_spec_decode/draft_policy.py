"""The ``draft`` decoding policy: a smaller model's greedy tokens, verified exactly by the target model.

The draft model (``speculative_model``) is loaded by every rank's runner beside the target
(``DecodingPolicy.draft_model``): the core builds it with its own model classes and the target's
attention backend, and keeps its KV cache in the target's blocks (one allocator for both, so a
request's draft KV is freed with it; see the core's ``runner/draft_model.py``). ``propose`` asks it,
through the executor, for each running request's draft of as many tokens as its adaptive length
allows; the draft runs its own forward passes (one over the tokens it has not computed yet, then one
per further draft token). Its proposals are its greedy tokens: a point-mass draft distribution, so
``accept`` (``rejection.py``) keeps exactly what modified rejection sampling keeps, and the output is
the plain output in distribution (greedy: token for token).

A draft whose vocabulary or tokenizer differs from the target's is refused at start (``validate``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from infer_core.interfaces import DraftRequest, Executor, Request, RequestStatus

from infer_spec_decode.rejection import RejectionSampling
from infer_spec_decode.settings import SpecDecodeSettings


def _config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _tokenizer_vocab(folder: Path) -> dict | None:
    """The tokenizer's vocabulary and added tokens (tokenizer.json), None where the folder has none."""
    try:
        data = json.loads((folder / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    return {"vocab": (data.get("model") or {}).get("vocab"),
            "added": sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or [])}


def mismatch(target: Path | None, target_vocab_size: int, draft: Path) -> str | None:
    """Why ``draft`` cannot draft for the target (its vocabulary or tokenizer differs), None when it can."""
    size = _config(draft).get("vocab_size")
    if size is not None and size != target_vocab_size:
        return (f"the draft model {draft} has a vocabulary of {size} tokens and the target {target or 'model'} one of "
                f"{target_vocab_size}; a draft must share the target's tokenizer: pick a draft of the target's family")
    if target is not None:
        mine, theirs = _tokenizer_vocab(draft), _tokenizer_vocab(target)
        if mine is not None and theirs is not None and mine != theirs:
            return (f"the draft model {draft} and the target {target} have different tokenizers (tokenizer.json); "
                    f"a draft must share the target's tokenizer: pick a draft of the target's family")
    return None


class DraftDecoding(RejectionSampling):
    @classmethod
    def validate(cls, ctx) -> list[str]:
        folder = SpecDecodeSettings.of(ctx.settings).speculative_model
        if not folder:
            return ["decoding=draft needs a draft model: set speculative_model (INFER_SPECULATIVE_MODEL) to a "
                    "checkpoint folder of a smaller model with the target's tokenizer"]
        draft = Path(folder).expanduser()
        if not draft.exists():
            return [f"speculative_model {folder!r} does not exist; pass a checkpoint folder (or .gguf file)"]
        target = Path(ctx.settings.model).expanduser() if ctx.settings.model else None
        if target is not None and target.is_file():
            target = target.parent
        reason = mismatch(target if target is not None and target.is_dir() else None, ctx.model.vocab_size,
                          draft.parent if draft.is_file() else draft)
        return [reason] if reason else []

    @classmethod
    def draft_model(cls, settings) -> str | None:
        return SpecDecodeSettings.of(settings).speculative_model

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.executor: Executor | None = None

    def bind(self, executor: Executor) -> None:
        self.executor = executor

    def propose(self, requests: Sequence[Request]) -> dict[str, list[int]]:
        batch = []
        live = set()
        for request in requests:
            live.add(request.request_id)
            # drafted once its prompt is computed and it is decoding: only its newest token is new
            if (request.status is not RequestStatus.RUNNING or request.num_computed_tokens != request.num_tokens - 1
                    or not self.may_draft(request)):
                continue
            k = self.lengths.allowed(request.request_id)
            if k:
                batch.append(DraftRequest(request.request_id, request.all_token_ids, k, request.num_preemptions))
        if len(self.first_position) > len(live) or len(self.lengths.states) > len(live):
            for request_id in [r for r in self.first_position if r not in live]:
                del self.first_position[request_id]
            self.lengths.keep_only(live)
        if not batch:
            return {}
        drafts = self.executor.collective_rpc("propose_drafts", batch)[0]
        by_id = {request.request_id: request for request in requests}
        for request_id in drafts:
            self._drafted(by_id[request_id])
        return drafts
