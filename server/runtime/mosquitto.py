"""A mosquitto broker as a child process (``Mosquitto``): its config file, its port, restarts;
and where its executable is (``find_mosquitto``)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Self

from .local_process import LOOPBACK, LocalProcess, free_port, wait_listening

# Debian installs the broker as /usr/sbin/mosquitto (/usr/local/sbin from source): off the PATH
# of a user who is not root, who would otherwise fall back to the embedded broker.
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin")


def find_mosquitto() -> str | None:
    """The mosquitto executable: the one on PATH, else the one in /usr/sbin or /usr/local/sbin;
    None when mosquitto is not installed."""
    return shutil.which("mosquitto") or shutil.which("mosquitto", path=os.pathsep.join(SBIN_DIRS))


class Mosquitto(LocalProcess):
    """A mosquitto broker on a (free) loopback port, restartable on the same port; it logs to
    ``workdir``/mosquitto.log and, with ``persistence``, keeps its database in ``workdir``.

    Unless ``debian_defaults``, it is set up not to drop anything (a million queued messages
    per client); with it, only what Debian's stock mosquitto.conf sets (persistence) applies,
    so mosquitto's own limits do (1,000 queued messages per client). ``extra_config`` is
    appended; a ``password_file`` in it turns anonymous access off. ``kind``, ``protocol`` and
    ``stop`` make it a ``broker.ManagedBroker`` for ``livefit serve`` and the demo.
    """

    kind = "mosquitto"
    protocol = "5"
    stop_timeout_s = 10.0
    log_mode = "ab"  # one log across restarts

    def __init__(
        self, workdir: Path, port: int | None = None, *, host: str = LOOPBACK,
        persistence: bool = True, debian_defaults: bool = False, extra_config: str = "",
    ) -> None:  # fmt: skip
        executable = find_mosquitto()
        if executable is None:
            raise RuntimeError(
                "mosquitto is not installed: not on PATH, in /usr/sbin or in /usr/local/sbin "
                "(apt-get install mosquitto)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.host, self.port = workdir, host, port or free_port(host)
        self.persistence, self.debian_defaults = persistence, debian_defaults
        self.extra_config = extra_config
        self.conf = workdir / "mosquitto.conf"
        argv = [executable, "-c", str(self.conf)]
        super().__init__("mosquitto", argv, workdir / "mosquitto.log")

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config_text(self) -> str:
        anonymous = "false" if "password_file" in self.extra_config else "true"
        user = "user root\n" if os.geteuid() == 0 else ""
        kept = (
            f"persistence true\npersistence_location {self.workdir}/\n"
            if self.persistence
            else "persistence false\n"
        )
        limits = "" if self.debian_defaults else (
            ("autosave_interval 1\n" if self.persistence else "")
            + "max_queued_messages 1000000\nmax_inflight_messages 1000\n"
        )  # fmt: skip
        return (
            f"listener {self.port} {self.host}\nallow_anonymous {anonymous}\n{user}{kept}{limits}"
            f"log_dest stdout\n{self.extra_config}"
        )

    def start(self, timeout: float = 10.0) -> Self:
        """Start and return once it listens; RuntimeError with its log's end if it does not."""
        self.conf.write_text(self.config_text())
        super().start()
        try:
            wait_listening(self.host, self.port, self.alive, "mosquitto", timeout)
        except RuntimeError as exc:
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"{exc}:\n{self.tail()}") from None
        return self

    def restart(self, sig: int = signal.SIGTERM) -> Self:
        """Stop with ``sig`` and start again on the same port, with the same database."""
        self.stop(sig)
        return self.start()
