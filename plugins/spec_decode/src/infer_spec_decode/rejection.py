"""Verification shared by the speculative policies: exact acceptance of point-mass drafts, counters, k.

``accept`` keeps, per request, the drafts the target accepts and one token of the target's own, by
modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023) for a draft distribution that
is a point mass (a prompt-lookup draft, or a draft model's greedy tokens). ``RunnerOutput.draft_probs``
gives p_j(d_j), the target's probability of draft token j after every sampling transform: d_j is
kept with probability p_j(d_j); at the first rejection the runner's token for that position, drawn
from the residual (p_j without d_j, renormalised), is kept and the rest dropped; all kept, the token
the target sampled after the last draft is kept too. Each kept token is then distributed as plain
sampling's. A greedy row's p is 1 for its argmax and 0 elsewhere: a draft is kept exactly when it is
the greedy token.

The uniform draws are the policy's own: from (seed, output position) for a seeded request, so its
tokens are the same run to run; from a generator seeded by the engine's ``seed`` otherwise.
Requests that ask for logprobs at temperature > 0 are not drafted: the runner reports the logprob of
the token it sampled at a position, which is not the draft token that position may keep. Nor are
requests still within ``min_tokens``: the runner bans the end tokens at all of a request's positions
while its output is shorter than that.
"""

from __future__ import annotations

import random

from infer_core.interfaces import DecodingPolicy, Request, RunnerOutput, SchedulerOutput, SpecDecodingStats

from infer_spec_decode.adaptive import AdaptiveDraftLength
from infer_spec_decode.settings import SpecDecodeSettings


class RejectionSampling(DecodingPolicy):
    """What a speculative policy shares; a subclass proposes (``propose``), calling ``_drafted`` per draft."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.settings = SpecDecodeSettings.of(ctx.settings)
        self.k = self.settings.num_speculative_tokens
        self.lengths = AdaptiveDraftLength(self.k)
        self.first_position: dict[str, tuple[int | None, int]] = {}  # drafted: (seed, output index of draft 0)
        self.rng = random.Random(ctx.settings.seed)
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_position = [0] * self.k
        self.wrong_guesses: set[str] = set()  # this step's drafts that followed a guess found wrong: k stays

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    @staticmethod
    def may_draft(request: Request) -> bool:
        """False for requests that are not drafted (see the module's doc)."""
        params = request.sampling_params
        return not ((params.logprobs is not None and not params.is_greedy)
                    or request.num_output_tokens < params.min_tokens)

    def _drafted(self, request: Request) -> None:
        self.first_position[request.request_id] = (request.sampling_params.seed, request.num_output_tokens)

    def _uniform(self, request_id: str, j: int) -> float:
        seed, first = self.first_position.get(request_id, (None, 0))
        if seed is None:
            return self.rng.random()
        return random.Random(seed * 2**32 + first + j).random()

    def accept(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> dict[str, list[int]]:
        accepted: dict[str, list[int]] = {}
        spec = scheduler_output.spec_token_ids
        all_probs = runner_output.draft_probs
        for i, (request_id, sampled) in enumerate(zip(runner_output.request_ids, runner_output.sampled_token_ids)):
            if not sampled:
                continue
            draft = spec.get(request_id) if spec else None
            if not draft:
                accepted[request_id] = sampled
                continue
            if len(sampled) != len(draft) + 1:
                raise RuntimeError(f"request {request_id}: {len(sampled)} sampled tokens for a draft of "
                                   f"{len(draft)}; the runner samples one per draft token plus one")
            if all_probs is None:
                raise RuntimeError("the runner verified drafts without reporting their probabilities "
                                   "(RunnerOutput.draft_probs); this policy needs them")
            probs = all_probs[i]
            keep = []
            for j, token in enumerate(draft):
                if self._uniform(request_id, j) < probs[j]:
                    keep.append(token)
                else:
                    keep.append(sampled[j])
                    break
            else:
                keep.append(sampled[-1])
            self._count(request_id, len(draft), len(keep) - 1)
            accepted[request_id] = keep
        return accepted

    def _count(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1
        if request_id not in self.wrong_guesses:
            self.lengths.record(request_id, num_drafted, num_accepted)

    def stats(self) -> SpecDecodingStats:
        return SpecDecodingStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                 tuple(self.accepted_per_position))
