"""``children``'s own pieces: ``prctl`` looked up once from this process's symbols. A child
dying with its parent, SIGKILL included, is ``tests/e2e/test_children.py``'s."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from livefit.server.runtime import children

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl")


@linux_only
def test_prctl_is_looked_up_once_and_never_through_ldconfig(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(name: str) -> str:
        raise AssertionError(f"find_library({name!r}) runs ldconfig")

    monkeypatch.setattr(ctypes.util, "find_library", refused)
    children.prctl.cache_clear()
    found = children.prctl()
    assert found is not None and children.prctl() is found
    assert children.die_with_parent() is not None
