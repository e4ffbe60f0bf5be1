"""``livefit demo`` as a user runs it: a child process, stopped with real signals.

Ctrl-C (SIGINT) stops it within seconds with the summary so far and no traceback, leaving no
child process and no temporary directory; SIGKILL of the demo takes its children with it; a
broker URL where nothing listens fails at once; Debian's mosquitto is found off a user's PATH.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from rich.console import Console

from livefit import demo_broker
from livefit.demo_broker import choose_broker
from livefit.demo_stop import StopRequest
from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.runtime.local_process import free_port, is_listening
from livefit.server.runtime.mosquitto import SBIN_DIRS, Mosquitto
from tests.procfs import alive

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's"
    ),
    pytest.mark.timeout(600),  # a learner and a replica start TensorFlow on a shared machine
]


class Demo:
    """``livefit demo --no-live ...`` with its output collected line by line."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        env = dict(os.environ, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("COLUMNS", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "livefit", "demo", "--no-live", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, cwd=tmp_path, env=env,
        )  # fmt: skip
        self.lines: list[str] = []
        self.spawned: set[int] = set()  # killed at teardown even once re-parented
        self._reader = threading.Thread(target=self._read, name="demo-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.process.poll() is None, f"demo exited early:\n{self.output}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{self.output}"
            time.sleep(0.1)

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def demos() -> Iterator[list[Demo]]:
    started: list[Demo] = []
    yield started
    for demo in started:
        for pid in demo.spawned | descendants(demo.process.pid):
            kill_quietly(pid)
        demo.close()


def children(pid: int) -> set[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def descendants(pid: int) -> set[int]:
    found = children(pid)
    for child in list(found):
        found |= descendants(child)
    return found


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while (left := {pid for pid in pids if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_ctrl_c_stops_everything_at_once_with_the_summary(
    broker: Mosquitto, tmp_path: Path, demos: list[Demo]
) -> None:
    """Ctrl-C (SIGINT). ``kill`` (SIGTERM) and a hangup reach the same handler, which
    ``tests/unit/livefit/test_demo_stop.py`` sends them to; the exit status is 128 + the
    signal either way."""
    sig, code = signal.SIGINT, 130
    demo = Demo(tmp_path, "--broker", broker.url, "--duration", "300", "--clients", "2")
    demos.append(demo)
    demo.wait_for("trained=", timeout=400)  # learner and replica ready, traffic flowing
    spawned = demo.spawned = descendants(demo.process.pid)
    assert len(spawned) >= 2, demo.output  # learner and replica
    interrupted = time.monotonic()
    demo.process.send_signal(sig)
    exit_code = demo.finish(timeout=20)
    took = time.monotonic() - interrupted

    assert exit_code == code, demo.output
    assert took < 10, f"took {took:.1f} s to stop"
    assert "Traceback" not in demo.output and "KeyboardInterrupt" not in demo.output
    assert "livefit demo: summary after" in demo.output
    assert "predictions served" in demo.output
    assert "0/0 s" not in demo.output
    assert "loss=0.00000" not in demo.output  # "-" until something was trained
    assert all(len(line) <= 80 for line in demo.lines), demo.output
    assert not wait_gone(spawned, timeout=5), "children outlived the demo"
    assert not list(tmp_path.glob("livefit-demo-*")), "the temporary directory was left behind"
    model = re.search(r"^model (demo-[0-9a-f]{6}) ", demo.output, re.MULTILINE)
    assert model is not None, demo.output  # a namespace of its own, not the default "demo"
    assert retained(broker, f"livefit/{model[1]}/weights") is None, "retained weights left"
    learner_session = f"livefit-{model[1]}-{model[1]}"  # <broker.client_id>-<model>
    assert not session_present(broker, learner_session), "the learner left an MQTT session"


def session_present(broker: Mosquitto, client_id: str) -> bool:
    """Whether the broker still holds a session for ``client_id`` (MQTT 5, clean start off)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    flags: list[bool] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id, protocol=mqtt.MQTTv5)
    client.on_connect = lambda _c, _u, f, _r, _p: flags.append(bool(f.session_present))
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 0
    client.connect("127.0.0.1", broker.port, clean_start=False, properties=properties)
    client.loop_start()
    try:
        deadline = time.monotonic() + 5
        while not flags and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
    assert flags, "no CONNACK"
    return flags[0]


def retained(broker: Mosquitto, topic: str) -> bytes | None:
    """The retained message on ``topic``, or None when there is none (none within 1 s)."""
    got: list[bytes] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.on_message = lambda _c, _u, message: got.append(bytes(message.payload))
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        deadline = time.monotonic() + 1.0
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
    return got[0] if got else None


def test_children_die_with_a_killed_demo(tmp_path: Path, demos: list[Demo]) -> None:
    demo = Demo(tmp_path, "--duration", "300")
    demos.append(demo)
    deadline = time.monotonic() + 30
    while len(descendants(demo.process.pid)) < 2:  # learner and replica started
        assert demo.process.poll() is None, demo.output
        assert time.monotonic() < deadline, demo.output
        time.sleep(0.1)
    time.sleep(0.5)  # past their interpreter start
    spawned = demo.spawned = descendants(demo.process.pid)
    demo.process.kill()
    demo.finish(timeout=10)
    assert not wait_gone(spawned, timeout=5), "children outlived a SIGKILLed demo"


def test_a_broker_url_where_nothing_listens_fails_at_once(
    tmp_path: Path, demos: list[Demo]
) -> None:
    port = free_port()
    demo = Demo(tmp_path, "--broker", f"mqtt://127.0.0.1:{port}")
    demos.append(demo)
    started = time.monotonic()
    assert demo.finish(timeout=30) == 1
    assert time.monotonic() - started < 15
    assert f"nothing listens at 127.0.0.1:{port}" in demo.output
    assert "existing" not in demo.output and "Traceback" not in demo.output
    assert not list(tmp_path.glob("livefit-demo-*"))


@pytest.mark.skipif(
    not any(Path(folder, "mosquitto").exists() for folder in SBIN_DIRS),
    reason="mosquitto is not installed in /usr/sbin or /usr/local/sbin here",
)
# amqtt's own, on import, should the demo wrongly fall back to it: the assertion says so instead
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_demo_starts_mosquitto_from_sbin_off_a_users_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian puts mosquitto in /usr/sbin, which is not on a non-root user's PATH: the demo
    must still start it rather than fall back to the embedded broker."""
    # as on a fresh machine, whatever else on this one listens on 127.0.0.1:1883
    monkeypatch.setattr(demo_broker, "is_listening", lambda *_, **__: False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a user's PATH, no mosquitto on it
    said = io.StringIO()
    broker = choose_broker("auto", tmp_path, StopRequest(), Console(file=said))
    try:
        assert broker is not None and broker.managed is not None, said.getvalue()
        assert broker.managed.kind == "mosquitto", said.getvalue()
        address = parse_broker_url(broker.url)
        assert is_listening(address.host, address.port)
    finally:
        if broker is not None and broker.managed is not None:
            broker.managed.stop()


def test_demo_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from livefit.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 5000.0)", "(default: 10)", "(default: 8)", "(default: 30.0)"):
        assert default in text, text


def test_the_demo_runs_over_mqtt_311(amqtt_broker: str, tmp_path: Path, demos: list[Demo]) -> None:
    """A broker that speaks MQTT 3.1.1 only (amqtt, what the demo starts without mosquitto):
    learner, replica (the weight stream, signature in the payload) and publisher all use
    3.1.1, and the replica serves the learner's weights."""
    demo = Demo(tmp_path, "--broker", amqtt_broker, "--duration", "15", "--clients", "2")
    demos.append(demo)
    demo.finish(timeout=500)
    assert "MQTT 3.1.1 only" in demo.output, demo.output
    assert "Traceback" not in demo.output, demo.output
    replica = re.search(r"replica version\s*[│|]?\s*([\d,]+)", demo.output)
    assert replica is not None and int(replica[1].replace(",", "")) > 0, demo.output
    served = re.search(r"^([\d,]+) predictions served", demo.output, re.MULTILINE)
    assert served is not None and int(served[1].replace(",", "")) > 0, demo.output
    # the summary's rate is the whole run's (samples trained over the seconds it ran), not
    # the last half second's, which is about 0 once the publisher has sent everything
    seconds = summary_figure(demo.output, r"summary after (\d+) s")
    trained = summary_figure(demo.output, r"samples trained\s*[│|]?\s*([\d,]+)")
    rate = summary_figure(demo.output, r"training samples/s\s*[│|]?\s*([\d,]+)")
    assert 0.6 * trained / seconds <= rate <= 1.5 * trained / seconds, demo.output


def summary_figure(output: str, pattern: str) -> float:
    found = re.findall(pattern, output)
    assert found, f"no {pattern!r} in:\n{output}"
    return float(found[-1].replace(",", ""))


def test_a_broker_refusing_the_demo_says_why_at_once(tmp_path: Path, demos: list[Demo]) -> None:
    """A broker that wants a password: the demo says what the broker answered, at once."""
    passwd = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "u", "p"], check=True)
    refusing = Mosquitto(tmp_path / "mosquitto", extra_config=f"password_file {passwd}\n")
    refusing.start()
    try:
        demo = Demo(tmp_path, "--broker", f"mqtt://u:wrong-pw@127.0.0.1:{refusing.port}")
        demos.append(demo)
        assert demo.finish(timeout=30) == 1
        text = " ".join(demo.output.split())
        assert "cannot connect: Not authorized; check the user and password" in text, text
        assert "wrong-pw" not in text and "Traceback" not in text
        assert not list(tmp_path.glob("livefit-demo-*"))
    finally:
        refusing.stop()
