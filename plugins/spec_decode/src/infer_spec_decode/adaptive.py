"""Adaptive draft length: a request whose drafts keep failing proposes fewer tokens, then none for a while.

Each verified draft moves the request's draft length ``k``: all of it accepted, one more next time
(up to the setting); a rejection, one more than were accepted. Drafts rejected at their first token
``pause_after`` times in a row stop the request drafting for a number of steps that doubles with
every further miss (``max_pause`` at most); then it probes with a draft of one token.
A verify step costs more than a plain decode step, so a request whose output does not repeat its
context soon decodes as if there were no speculation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class DraftLength:
    """One request's draft-length state."""

    k: int
    misses: int = 0  # verified drafts in a row whose first token was rejected
    paused: int = 0  # proposals left in which the request does not draft


class AdaptiveDraftLength:
    def __init__(self, max_k: int, pause_after: int = 2, max_pause: int = 64) -> None:
        self.max_k, self.pause_after, self.max_pause = max_k, pause_after, max_pause
        self.states: dict[str, DraftLength] = {}

    def allowed(self, request_id: str) -> int:
        """Draft tokens the request may propose this step (0: a plain decode step); called once a step."""
        state = self.states.get(request_id)
        if state is None:
            return self.max_k
        if state.paused:
            state.paused -= 1
            return 0
        return state.k

    def record(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """A verified draft of ``num_drafted`` tokens of which the first ``num_accepted`` were kept."""
        state = self.states.setdefault(request_id, DraftLength(self.max_k))
        if num_accepted == num_drafted:
            state.k, state.misses = min(self.max_k, max(state.k, num_drafted + 1)), 0
            return
        state.k = num_accepted + 1
        state.misses = state.misses + 1 if num_accepted == 0 else 0
        if state.misses >= self.pause_after:
            state.paused = min(self.max_pause, 2 ** (state.misses - self.pause_after + 2))

    def keep_only(self, request_ids: set[str]) -> None:
        """Forget the requests that are no longer live."""
        for request_id in [r for r in self.states if r not in request_ids]:
            del self.states[request_id]
