"""Request ids: the prefix and 32 hex digits of ``uuid4().hex``, drawn without a system call each."""

from __future__ import annotations

import re

from infer_core.server.generation import new_request_id


def test_ids_look_like_uuid4_hex_and_do_not_repeat():
    ids = [new_request_id("cmpl") for _ in range(10_000)]
    assert all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
