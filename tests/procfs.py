"""Reading a process's state from /proc, for tests that check who outlived whom."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (exited, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"
