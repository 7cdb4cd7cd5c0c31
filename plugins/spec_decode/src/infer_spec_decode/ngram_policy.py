"""The ``ngram`` decoding policy: prompt-lookup drafts, verified exactly by the target model.

``propose`` (before the step is scheduled) drafts, for each running request, the tokens that
followed the latest earlier occurrence of its newest n-gram (``ngram_index.py``), as many as its
adaptive draft length allows (``adaptive.py``). The scheduler places them after the request's
last token; the runner computes the k+1 positions in one forward pass and samples each; ``accept``
(``rejection.py``) keeps what modified rejection sampling keeps.
"""

from __future__ import annotations

from collections.abc import Sequence

from infer_core.interfaces import Request

from infer_spec_decode.ngram_index import NgramIndex
from infer_spec_decode.rejection import RejectionSampling


class NgramDecoding(RejectionSampling):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.min_n, self.max_n = self.settings.prompt_lookup_min, self.settings.prompt_lookup_max
        self.indexes: dict[str, NgramIndex] = {}

    def propose(self, requests: Sequence[Request]) -> dict[str, list[int]]:
        drafts: dict[str, list[int]] = {}
        live = set()
        for request in requests:
            request_id = request.request_id
            live.add(request_id)
            if not self.may_draft(request):
                continue
            index = self.indexes.get(request_id)
            if index is None:
                index = self.indexes[request_id] = NgramIndex(self.min_n, self.max_n)
            k = self.lengths.allowed(request_id)
            draft = index.propose(request.all_token_ids, k)
            if draft:
                drafts[request_id] = draft
                self._drafted(request)
        if len(self.indexes) > len(live):
            for request_id in [r for r in self.indexes if r not in live]:
                del self.indexes[request_id]
                self.first_position.pop(request_id, None)
            self.lengths.keep_only(live)
        return drafts
