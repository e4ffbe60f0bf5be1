"""``children``'s own pieces: ``prctl`` looked up once from this process's symbols, and
``/proc/PID/stat`` read past a command name of any characters. A child
dying with its parent, SIGKILL included, is ``tests/e2e/test_children.py``'s."""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path

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


@linux_only
def test_stat_fields_start_after_a_command_name_with_parentheses_and_spaces() -> None:
    """This process renamed ``a) (b c``: its state is field 3, its parent's pid field 4."""
    from livefit.server.runtime.fork_server import set_process_name

    own = Path("/proc/self/comm").read_text().strip()
    set_process_name("a) (b c")
    try:
        fields = children.stat_fields(os.getpid())
    finally:
        set_process_name(own)
    assert fields[0] in "RS" and fields[4 - 3] == str(os.getppid())
    with pytest.raises(FileNotFoundError):
        children.stat_fields("no-such-process")
