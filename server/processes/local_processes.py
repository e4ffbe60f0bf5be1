"""Local child processes: free ports, a mosquitto broker, livefit (or any HTTP) servers.

One toolkit for every side that starts processes on this machine: ``livefit serve`` (its
``auto`` broker), the demo, the tests and the benchmarks. Every process started here keeps
``children``'s promises: it dies with the process that started it and runs in its own process
group, so a terminal's Ctrl-C reaches only the parent, which stops its children itself and in
its own order (``stop_all``). Output goes to a log file; an error about a process that did not
come up ends with the last lines of that log.

The parts: one child process and ports (``local_process``), mosquitto (``local_mosquitto``),
HTTP and livefit servers (``local_servers``). This module gathers their names, so that every
user imports the toolkit from one place.
"""

from livefit.server.processes.local_mosquitto import Mosquitto
from livefit.server.processes.local_process import (
    LOOPBACK,
    QUIET_ENV,
    LocalProcess,
    free_port,
    is_listening,
    quiet_env,
    running,
    stop_all,
    wait_listening,
)
from livefit.server.processes.local_servers import (
    READINESS,
    HttpProcess,
    LivefitProcess,
    NotReady,
)

__all__ = [
    "LOOPBACK",
    "QUIET_ENV",
    "READINESS",
    "HttpProcess",
    "LivefitProcess",
    "LocalProcess",
    "Mosquitto",
    "NotReady",
    "free_port",
    "is_listening",
    "quiet_env",
    "running",
    "stop_all",
    "wait_listening",
]
