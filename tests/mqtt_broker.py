"""A real mosquitto broker on a free loopback port, for tests: start, stop, restart."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from livefit.server.children import die_with_parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MosquittoBroker:
    """One mosquitto child process with persistence in ``workdir``; restartable on the same port."""

    def __init__(
        self, workdir: Path, port: int | None = None, extra_config: str = "", *,
        debian_defaults: bool = False,
    ) -> None:  # fmt: skip
        """``debian_defaults``: only what Debian's stock mosquitto.conf sets (persistence), so
        mosquitto's own limits apply (1,000 queued messages per client); put drop-in settings
        in ``extra_config``. Otherwise the test broker is set up not to drop anything."""
        if shutil.which("mosquitto") is None:
            raise RuntimeError("mosquitto is not on PATH (apt-get install mosquitto)")
        self.workdir = workdir
        self.port = port or free_port()
        self.extra_config = extra_config
        self.debian_defaults = debian_defaults
        self.process: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        user = "user root\n" if os.geteuid() == 0 else ""
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"allow_anonymous {'false' if 'password_file' in self.extra_config else 'true'}\n"
            f"{user}"
            "persistence true\n"
            f"persistence_location {self.workdir}/\n"
            + (
                ""
                if self.debian_defaults
                else "autosave_interval 1\n"
                "max_queued_messages 1000000\n"
                "max_inflight_messages 1000\n"
                "persistent_client_expiration 1d\n"
            )
            + f"log_dest file {self.log}\n"
            f"{self.extra_config}"
        )
        self.process = subprocess.Popen(
            ["mosquitto", "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),  # no broker outlives a killed test run
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log.read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout}s")

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()
