"""LLM: the offline Python API (``generate`` and ``chat``) over one Engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from infer_core.engine.engine import Engine, Prompt
from infer_core.outputs import RequestOutput
from infer_core.sampling_params import SamplingParams

Message = dict[str, Any]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A str or a list of token ids is one prompt; a list of those is many."""
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty; pass a string, a list of token ids, or a list of those")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [prompts]
    return prompts


def _as_params(sampling_params, count: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    params = list(sampling_params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling_params for {count} prompts; pass one, or one per prompt")
    return params


def _as_priorities(priority: int | Sequence[int], count: int) -> list[int]:
    if isinstance(priority, int) and not isinstance(priority, bool):
        return [priority] * count
    priorities = list(priority)
    if len(priorities) != count or not all(isinstance(p, int) and not isinstance(p, bool) for p in priorities):
        raise ValueError(f"priority must be an integer or one per prompt ({count}), got {priority!r}")
    return priorities


class LLM:
    """Generate from a model in this process: ``LLM(model=None, **settings)`` (None = embedded default).

    Keyword arguments are engine settings (``max_num_seqs=…``, ``attention="torch"``, …);
    they take precedence over INFER_* variables.
    """

    def __init__(self, model: str | None = None, **settings: Any) -> None:
        self.engine = Engine.from_settings(model=model, **settings)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params=None, use_tqdm: bool = True,
                 *, add_special_tokens: bool = True, priority: int | Sequence[int] = 0) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in the order of the prompts.

        ``priority`` (one, or one per prompt): lower runs first under the ``priority`` scheduler.
        """
        prompt_list = _as_prompt_list(prompts)
        params = _as_params(sampling_params, len(prompt_list))
        priorities = _as_priorities(priority, len(prompt_list))
        return self._run([(p, sp, add_special_tokens, rank) for p, sp, rank in zip(prompt_list, params, priorities)],
                         use_tqdm)

    def chat(self, messages: list[Message] | Sequence[list[Message]], sampling_params=None, use_tqdm: bool = True,
             *, chat_template: str | None = None, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Answer one conversation (a list of messages) or several, through the model's chat template."""
        if not messages:
            raise ValueError("messages is empty; pass a list of {'role', 'content'} dicts, or a list of those")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        params = _as_params(sampling_params, len(conversations))
        texts = [self.engine.render_chat(c, add_generation_prompt, chat_template) for c in conversations]
        return self._run([(t, sp, False, 0) for t, sp in zip(texts, params)], use_tqdm)

    def _run(self, items: list[tuple[Prompt, SamplingParams, bool, int]], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.engine
        ids: list[str] = []
        try:
            for prompt, params, special, priority in items:
                # only each step's delta_token_ids and the final outputs are read below
                ids.append(engine.add_request(None, prompt, params, add_special_tokens=special, priority=priority,
                                              final_only=True))
        except BaseException:
            for request_id in ids:
                engine.abort(request_id)
            raise
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Generating", unit="req", disable=not use_tqdm)
        num_tokens = 0
        try:
            while len(finished) < len(ids):
                for output in engine.step():
                    num_tokens += sum(len(c.delta_token_ids) for c in output.outputs)
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
                bar.set_postfix_str(f"{num_tokens / max(bar.format_dict['elapsed'], 1e-9):.0f} tok/s", refresh=False)
        except BaseException:
            for request_id in ids:
                if request_id not in finished:
                    engine.abort(request_id)
            raise
        finally:
            bar.close()
        return [finished[i] for i in ids]

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
