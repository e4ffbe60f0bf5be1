"""livefit's servers started from a preloaded interpreter: the suite's end-to-end tests start
some 250 ``livefit serve``/``replica`` processes, and each spent 2.3 s of its 3.3 s of CPU up to
readiness importing TensorFlow, Keras and livefit (docs/testing.md, "Preloaded starts").

One fork server per test worker (``python -m tests.forkserver SOCKET``, started on the first
launch, dying with the worker) imports them once, as ``livefit serve`` would, then forks a child
for each launch with livefit's own fork server (``server/runtime/fork_server.py``, which a split
learner and a replica group use: ``processes.preload``); here it also lists the devices once,
and the child's output goes to the log the test opened. The child becomes what ``python -m livefit ARGS`` would be: its own process
group, the parent-death signal, stdin from /dev/null, stdout and stderr to the log the test
opened, the test's environment and working directory (first on ``sys.path``, as ``-m`` puts
it), ``livefit``'s ``__main__`` run as the main module, and Python's own exit (threads joined,
atexit, the exit status). The test gets a ``subprocess.Popen`` whose ``poll`` and ``wait`` read
the status the fork server reaped; signals go to the real pid, as before.

What stays a fresh start (``launch`` falls back to ``children.start_child``): any command but
``python -m livefit``, an environment that differs from the fork server's in a variable read
while importing (``IMPORT_TIME_ENV``), and what starts within ``fresh_starts()`` (a test about
how a process starts: the split learner's supervisor never loading TensorFlow, for example).
``LIVEFIT_TEST_FRESH_PROCESSES=1`` starts every process fresh.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

FRESH_ENV = "LIVEFIT_TEST_FRESH_PROCESSES"
# Variables read while TensorFlow, Keras or Python start (the fork server read them once):
# a launch whose environment differs from the fork server's in one of these starts fresh.
IMPORT_TIME_ENV = ("TF_", "CUDA", "KERAS", "XLA", "OMP_", "MKL", "PYTHON", "LD_", "MALLOC",
                   "HOME", "NVIDIA", "TPU", "LANG", "LC_")  # fmt: skip
SOCKET_PATH_MAX = 96  # a Unix socket's path is at most 107 bytes on Linux (and BINDING_SUFFIX)


# Read at start too, but set up in the child as Python would have: the bench's processes run
# with PYTHONWARNINGS=ignore
WARNINGS_ENV = "PYTHONWARNINGS"


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` read while starting and importing, but PYTHONWARNINGS when it
    names only actions (``ignore``, ``default``...: ``warn_as_python_would``)."""
    picked = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}
    if ":" not in picked.get(WARNINGS_ENV, ":"):
        del picked[WARNINGS_ENV]
    return picked


def warn_as_python_would(env: Mapping[str, str]) -> None:
    """PYTHONWARNINGS' actions, each put first as Python's start puts them (an action alone
    applies to every warning)."""
    options = [o.strip() for o in env.get(WARNINGS_ENV, "").split(",") if o.strip()]
    sys.warnoptions[:] = options
    for action in options:
        warnings.simplefilter(action)  # type: ignore[arg-type]


# ---- the fork server (``python -m tests.forkserver SOCKET``) ----


def _preload() -> None:
    """Import what a livefit server imports (``fork_server.preload``), and list the devices
    once here rather than in every child (the CUDA probe: a test machine has no GPU, where a
    fork after CUDA started would be unusable)."""
    import tensorflow as tf

    from livefit.server.base import tensorflow_start
    from livefit.server.runtime import fork_server

    fork_server.preload()
    with tensorflow_start.filtered_stderr():
        tf.config.list_physical_devices("GPU")


def main(argv: Sequence[str]) -> None:
    import runpy

    from livefit.server.runtime import fork_server

    unblocked = fork_server.hold_stop_signals()
    _preload()
    print(f"fork server ready on {argv[0]}", flush=True)
    fork_server.serve(argv[0], unblocked)
    warn_as_python_would(os.environ)
    runpy.run_module("livefit", run_name="__main__", alter_sys=True)


# ---- the launcher, in the test worker ----


def supervises_only(args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``livefit ARGS`` is a group's parent, which never imports TensorFlow (a split
    learner's, a replica's worker group's): forking it saves nothing, and tests check that it
    maps no TensorFlow. A config that cannot be read is forked: the child says what is wrong."""
    from livefit.server.config.settings import ConfigError, load_settings

    if not args or args[0] not in ("serve", "replica") or "--config" not in args:
        return False
    try:
        settings = load_settings(args[args.index("--config") + 1], env)
    except (ConfigError, IndexError, OSError):
        return False
    if "--workers" in args:
        with contextlib.suppress(IndexError, ValueError):
            settings.http.workers = int(args[args.index("--workers") + 1])
    if args[0] == "serve":
        return settings.http.learner_workers() >= 1
    return settings.http.replica_workers() > 1


class ForkServer:
    """This test worker's fork server, started on the first launch."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket_path = str(workdir / "forkserver.sock")
        if len(self.socket_path) > SOCKET_PATH_MAX:  # a long TMPDIR: a short directory instead
            self.socket_path = os.path.join(tempfile.mkdtemp(prefix="lf-fork-"), "socket")
        self.env: dict[str, str] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _start(self) -> None:
        from livefit.server.runtime import fork_server
        from livefit.server.runtime.children import start_child
        from livefit.server.runtime.local_process import quiet_env

        self.workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.env = quiet_env()
        root = Path(__file__).resolve().parent.parent
        with (self.workdir / "forkserver.log").open("wb") as log:
            self.process = start_child([sys.executable, "-m", "tests.forkserver", self.socket_path],
                                       stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                       cwd=root)  # fmt: skip
        if not fork_server.listens(self.process, self.socket_path, fork_server.START_TIMEOUT_S):
            raise RuntimeError(
                f"the fork server did not start: {(self.workdir / 'forkserver.log').read_text()}"
            )

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def can_launch(self, argv: Sequence[str], env: Mapping[str, str] | None) -> bool:
        """Whether ``argv`` is ``python -m livefit ...`` that runs models in its own process
        (``supervises_only``), with an environment this fork server imported under (the
        variables of ``IMPORT_TIME_ENV``)."""
        if list(argv[:3]) != [sys.executable, "-m", "livefit"]:
            return False
        if supervises_only(argv[3:], env if env is not None else os.environ):
            return False
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.env is not None
        given = import_time_env(env if env is not None else os.environ)
        return given == import_time_env(self.env)

    def launch(self, argv: Sequence[str], *, stdout: Any, env: Mapping[str, str] | None = None,
               cwd: Path | str | None = None,
               **popen: Any) -> subprocess.Popen[bytes]:  # fmt: skip
        """``python -m livefit ARGS`` (``argv``) forked from the fork server, output to the open
        file ``stdout`` (stderr with it: the only way LocalProcess starts a child)."""
        assert popen.get("stderr") == subprocess.STDOUT and set(popen) <= {"stderr"}, popen
        from livefit.server.runtime.fork_server import request_fork

        return request_fork(self.socket_path, argv, env if env is not None else os.environ,
                            str(cwd) if cwd is not None else os.getcwd(),
                            {stdout.fileno(): [1, 2]})  # fmt: skip


_server: ForkServer | None = None


def use_fork_server(workdir: Path) -> None:
    """From now on start ``LivefitProcess`` children from a fork server (one per test worker,
    started on the first launch) where it can."""
    from livefit.local_servers import LivefitProcess

    global _server
    _server = ForkServer(workdir)
    LivefitProcess.launcher = staticmethod(launch)


def stop_fork_server() -> None:
    """Back to fresh starts, the fork server stopped."""
    from livefit.local_servers import LivefitProcess

    global _server
    if "launcher" in vars(LivefitProcess):
        delattr(LivefitProcess, "launcher")
    if _server is not None:
        _server.stop()
        _server = None


@contextlib.contextmanager
def fresh_starts() -> Iterator[None]:
    """Within: ``LivefitProcess`` children start as ``python -m livefit`` does, for a test about
    how a process starts (the split learner's supervisor never loads TensorFlow)."""
    with forking_from(None):
        yield


@contextlib.contextmanager
def forking_from(server: ForkServer | None) -> Iterator[None]:
    """Within: ``LivefitProcess`` children fork from ``server`` (None: they start fresh)."""
    from livefit.local_servers import LivefitProcess

    global _server
    kept, kept_launcher = _server, vars(LivefitProcess).get("launcher")
    _server = server
    LivefitProcess.launcher = staticmethod(launch)
    try:
        yield
    finally:
        _server = kept
        if kept_launcher is None:
            delattr(LivefitProcess, "launcher")
        else:
            LivefitProcess.launcher = kept_launcher


def launch(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``LivefitProcess.launcher`` while the fork server is in use: forked where it can be,
    else ``children.start_child``."""
    from livefit.server.runtime.children import start_child

    if _server is not None and _server.can_launch(argv, popen.get("env")):
        return _server.launch(argv, **popen)
    return start_child(argv, **popen)


if __name__ == "__main__":
    main(sys.argv[1:])
