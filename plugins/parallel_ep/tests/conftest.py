"""Fixtures of the expert-parallel suite: tiny real checkpoints, and a check that no worker outlives a test."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
from infer_core.testing import TinyCheckpoints


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> TinyCheckpoints:
    """``tiny_checkpoint("qwen3_moe", num_experts=6)`` -> folder of a random tiny model."""
    return TinyCheckpoints(tmp_path_factory)


def _child_pids() -> list[int]:
    """Live (not zombie) children of this process, multiprocessing's resource tracker aside."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z" and b"multiprocessing.resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def assert_no_workers_left():
    """A check that every worker process started during the test has exited and been reaped."""
    before = set(_child_pids())

    def check() -> None:
        assert multiprocessing.active_children() == []
        assert sorted(set(_child_pids()) - before) == []

    return check
