"""The ``ngram`` decoding policy: prompt-lookup drafts, verified exactly by the target model.

``propose`` (before the step is scheduled) drafts, for each running request, the tokens that
followed the latest earlier occurrence of its newest n-gram (``ngram_index.py``), as many as its
adaptive draft length allows (``adaptive.py``). The scheduler places them after the request's
last token; the runner computes the k+1 positions in one forward pass and samples each; ``accept``
(``rejection.py``) keeps what modified rejection sampling keeps.

Under overlapped scheduling the step in flight has not reported its tokens when the next one is
drafted. The copy that made its drafts also says what it should return: its drafts, all kept, and
the token after them. Each proposal remembers that guess (``Guess``); the next one, when the tokens
read since agree with the guess so far, drafts after the guessed output of the step in flight; when
they do not, that step's drafts followed a wrong guess and it most likely keeps one token, which is
guessed afresh from the tokens read. A draft that followed a guess found wrong by the time it is
verified says nothing about how well the request copies: it does not move the adaptive length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infer_core.interfaces import Request, RunnerOutput, SchedulerOutput

from infer_spec_decode.ngram_index import NgramIndex
from infer_spec_decode.rejection import RejectionSampling


@dataclass(frozen=True, slots=True)
class Guess:
    """Tokens a proposal took to follow the first ``start`` tokens of a request: the guessed output of
    the step then in flight (``num_assumed`` of them), then the step's drafts and the token after them."""

    start: int
    tokens: list[int]
    num_assumed: int


class NgramDecoding(RejectionSampling):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.min_n, self.max_n = self.settings.prompt_lookup_min, self.settings.prompt_lookup_max
        self.indexes: dict[str, NgramIndex] = {}
        self.guesses: dict[str, Guess] = {}  # the last proposal's, per request
        # Drafts that followed a guessed output, per request: (position of the step's first token, the guess),
        # the last two (the step in flight's and the one being planned: an older one was never scheduled)
        self.assumed: dict[str, list[tuple[int, Guess]]] = {}
        self.live: dict[str, Request] = {}

    def overlaps(self, requests: Sequence[Request]) -> bool:
        """Greedy requests without penalties only: a greedy verify step's kept length is counted on the
        device, and nothing else of the sampler reads the tokens in flight."""
        return all(r.sampling_params.is_greedy and not r.sampling_params.has_penalties for r in requests)

    def _in_flight(self, request: Request, index: NgramIndex) -> list[int] | None:
        """The guessed output of the request's step in flight ([] when none is; None: no guess)."""
        num_pending = request.num_pending_tokens
        if not num_pending:
            return []
        tokens = request.all_token_ids
        guess = self.guesses.get(request.request_id)
        if guess is not None:
            read = len(tokens) - guess.start
            if 0 <= read and len(guess.tokens) >= read + num_pending and tokens[guess.start:] == guess.tokens[:read]:
                return guess.tokens[read:read + num_pending]
        return index.propose(tokens, 1) or None  # a wrong guess: that step keeps one token, most likely

    def propose(self, requests: Sequence[Request]) -> dict[str, list[int]]:
        drafts: dict[str, list[int]] = {}
        live = self.live = {}
        for request in requests:
            request_id = request.request_id
            live[request_id] = request
            if not self.may_draft(request):
                self.guesses.pop(request_id, None)
                continue
            index = self.indexes.get(request_id)
            if index is None:
                index = self.indexes[request_id] = NgramIndex(self.min_n, self.max_n)
            in_flight = self._in_flight(request, index)
            if in_flight is None:
                self.guesses.pop(request_id, None)
                continue
            k = self.lengths.allowed(request_id)
            copied = index.propose(request.all_token_ids, k + 1, in_flight)  # the drafts and the token after
            self.guesses[request_id] = Guess(len(request.all_token_ids), in_flight + copied, len(in_flight))
            draft = copied[:k]
            if draft:
                drafts[request_id] = draft
                self._drafted(request)
                if in_flight:
                    first_position = request.num_computed_tokens + request.num_inflight_tokens
                    self.assumed[request_id] = [*self.assumed.get(request_id, ())[-1:],
                                                (first_position, self.guesses[request_id])]
        if len(self.indexes) > len(live):
            for request_id in [r for r in self.indexes if r not in live]:
                del self.indexes[request_id]
                self.guesses.pop(request_id, None)
                self.first_position.pop(request_id, None)
            self.lengths.keep_only(set(live))
            self.assumed = {request_id: kept for request_id, kept in self.assumed.items() if request_id in live}
        return drafts

    def accept(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> dict[str, list[int]]:
        self.wrong_guesses.clear()
        spec = scheduler_output.spec_token_ids
        if self.assumed and spec:
            for cached in scheduler_output.cached_requests:
                kept = self.assumed.get(cached.request_id) if cached.request_id in spec else None
                for first_position, guess in kept or ():
                    if first_position == cached.num_computed_tokens and not self._held(cached.request_id, guess):
                        self.wrong_guesses.add(cached.request_id)
        return super().accept(scheduler_output, runner_output)

    def _held(self, request_id: str, guess: Guess) -> bool:
        """Whether the tokens read since agree with the output ``guess`` assumed of the step before."""
        request = self.live.get(request_id)
        if request is None:
            return True
        assumed = guess.tokens[:guess.num_assumed]
        return request.all_token_ids[guess.start:guess.start + len(assumed)] == assumed
