"""Reading a process's state from /proc, for tests that check who outlived whom."""

from __future__ import annotations

from pathlib import Path

from livefit.server.runtime.fork_server import FORK_SERVER_NAME, TRAINING_NAME


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (exited, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def children(pid: int) -> list[int]:
    """The children of ``pid`` (none once it is gone)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(child) for child in (task / "children").read_text().split()]
    except OSError:
        return []
    return sorted(found)


def process_name(pid: int) -> str:
    """``pid``'s process name (``/proc/PID/comm``), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def group_processes(pid: int) -> list[int]:
    """The processes of the worker group whose parent is ``pid``: its children, those of its
    fork server in the fork server's place (``processes.preload``)."""
    found: list[int] = []
    for child in children(pid):
        found += children(child) if process_name(child) == FORK_SERVER_NAME else [child]
    return sorted(found)


def training_process(pid: int) -> int | None:
    """The training process of the split learner whose parent is ``pid``, if it runs."""
    for child in group_processes(pid):
        if process_name(child) == TRAINING_NAME:
            return child
    return None
