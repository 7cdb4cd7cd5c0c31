"""The listening line names the event loop and HTTP implementation uvicorn's "auto" picked."""

from __future__ import annotations

import asyncio

import pytest

from infer_core.server.serve import http_stack


class HttpToolsProtocol:  # named as uvicorn's classes are: the line reads the class name
    pass


class H11Protocol:
    pass


def test_the_fast_stack_is_named_and_a_slow_one_says_what_to_install():
    loop = asyncio.new_event_loop()
    try:
        assert http_stack(HttpToolsProtocol, loop).startswith("asyncio event loop, httptools HTTP")
        slow = http_stack(H11Protocol, loop)
        assert slow.startswith("asyncio event loop, h11 HTTP") and "pip install" in slow and "httptools" in slow
    finally:
        loop.close()
    uvloop = pytest.importorskip("uvloop")  # a core dependency, but not on Windows
    loop = uvloop.new_event_loop()
    try:
        assert http_stack(HttpToolsProtocol, loop) == "uvloop event loop, httptools HTTP"
    finally:
        loop.close()
