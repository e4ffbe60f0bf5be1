"""The live dashboard in a real browser: the page of a real learner process and of a replica in
headless Chromium, driven over the Chrome DevTools Protocol, while samples and predictions
stream in; it must show no console error, and its numbers and charts must move. It saves
screenshots to ``artifacts/``. The stats the page reads: ``tests/unit/http/test_dashboard.py``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from websockets.sync.client import ClientConnection, connect

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.http.dashboard import build_dashboard_router
from livefit.server.runtime.mosquitto import Mosquitto
from tests import configs
from tests.configs import SMALL_MLP, model
from tests.inprocess import InProcessServer
from tests.unit.http.test_dashboard import fill_metrics

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
APT_HINT = "apt-get install -y chromium (Debian's package; chromium-driver is not needed)"


def chromium_binary() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"headless Chromium not found; install it with: {APT_HINT}")


class Browser:
    """Headless Chromium on a free debugging port, and one page driven over DevTools Protocol."""

    def __init__(self, binary: str, workdir: Path) -> None:
        profile = workdir / "chromium-profile"
        self.log = workdir / "chromium.log"
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000",
                 f"--user-data-dir={profile}", "--remote-debugging-port=0"]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, *flags, "about:blank"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.ws: ClientConnection | None = None
        self.events: list[dict[str, Any]] = []
        self.next_id = 0
        try:
            self.ws = connect(self._page_websocket(profile / "DevToolsActivePort"), max_size=None)
        except BaseException:
            self.close()
            raise

    def _page_websocket(self, port_file: Path, timeout: float = 30.0) -> str:
        """The page target's websocket URL, once Chromium has written its debugging port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited:\n{self.log.read_text()[-3000:]}")
            if port_file.exists() and port_file.read_text().strip():
                port = port_file.read_text().split()[0]
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                pages = [t for t in targets if t["type"] == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.1)
        raise RuntimeError(
            f"chromium did not open a debugging port:\n{self.log.read_text()[-3000:]}"
        )

    def call(self, method: str, timeout: float = 10.0, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events read meanwhile are kept."""
        assert self.ws is not None
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def drain(self) -> None:
        """Keep every event that has arrived so far."""
        assert self.ws is not None
        try:
            while True:
                self.events.append(json.loads(self.ws.recv(timeout=0.05)))
        except TimeoutError:
            pass

    def wait_event(self, method: str, timeout: float = 15.0) -> None:
        assert self.ws is not None
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout}s")
            self.drain()

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors seen so far."""
        self.drain()
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(f"console: {[a.get('value') for a in params['args']]}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url')}")
        return found

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page, however long it is."""
        height = self.evaluate("document.documentElement.scrollHeight")
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=int(height),
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        time.sleep(0.3)  # one frame at the new size
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


class Feeder:
    """A thread streaming samples to the learner and asking servers for predictions, until stopped."""

    def __init__(self, broker: Mosquitto, servers: list[str], topic: str) -> None:
        self.broker_url, self.servers, self.topic = broker.url, servers, topic
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="dashboard-feeder")

    def _run(self) -> None:
        stream = LinearStream(input_dim=8, seed=0)
        try:
            with (
                SamplePublisher(self.broker_url, self.topic, fmt="msgpack") as publisher,
                httpx.Client(timeout=10) as client,
            ):
                while not self.stopping.is_set():
                    x, y = stream.sample(50)
                    publisher.publish(x, y, batched=True)
                    for url in self.servers:
                        predict = f"{url}/v1/models/demo:predict"
                        client.post(predict, json={"instances": x[:4].tolist()}).raise_for_status()
                    self.stopping.wait(0.05)
        except BaseException as exc:  # reported by stop(), in the test's thread
            self.error = exc

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "feeder did not stop"
        if self.error is not None:
            raise self.error


def learner_config(broker: Mosquitto, storage: Path) -> str:
    demo = model(
        builder="mlp", lines=f'{SMALL_MLP}\ntopic = "dashboard/demo/samples"',
        weights='topic = "dashboard/demo/weights"\npublish_interval_s = 0.2',
    )  # fmt: skip
    return configs.learner_config(broker, storage, f"dashboard-{broker.port}", demo)


READ_PAGE = """(() => {
  const model = document.querySelector('[data-model="demo"]');
  const nodes = sel => (model ? [...model.querySelectorAll(sel)] : []);
  const value = node => (node.dataset.value === "" ? null : Number(node.dataset.value));
  return {
    title: document.title, polls: Number(document.body.dataset.polls || 0),
    status: document.getElementById("status").className,
    stats: Object.fromEntries(nodes("[data-stat]").map(n => [n.dataset.stat, value(n)])),
    points: Object.fromEntries(nodes("canvas").map(c => [c.dataset.chart, Number(c.dataset.points)])),
  };
})()"""


Page = dict[str, Any]


def read_until(browser: Browser, ready: Callable[[Page], bool], timeout: float) -> Page:
    """Read the page until ``ready`` holds; return the last read either way."""
    deadline = time.monotonic() + timeout
    page = browser.evaluate(READ_PAGE)
    while not ready(page) and time.monotonic() < deadline:
        time.sleep(0.2)
        page = browser.evaluate(READ_PAGE)
    return dict(page)


def open_page(browser: Browser, url: str, ready: Callable[[Page], bool]) -> Page:
    """Load ``url``, wait for two polls and ``ready``; the page must say it is live."""
    browser.events.clear()
    browser.call("Page.navigate", url=url)
    browser.wait_event("Page.loadEventFired")
    page = read_until(browser, lambda p: p["polls"] >= 2 and ready(p), 15)
    assert page["status"] == "ok" and ready(page), page
    return page


def check_learner_page(browser: Browser, url: str) -> None:
    first = open_page(browser, url, lambda p: (p["stats"]["train_samples_total"] or 0) > 0)
    assert first["title"] == "livefit \u2013 learner"
    before = first["stats"]

    def moved(page: Page) -> bool:  # the page has followed the learner: on a loaded host, seconds
        after = page["stats"]
        return (bool(after["latency_p50_ms"])
                and page["points"]["samples"] > first["points"]["samples"]
                and after["train_samples_total"] > before["train_samples_total"]
                and after["model_version"] > before["model_version"])  # fmt: skip

    second = read_until(browser, moved, 30)
    browser.screenshot(ARTIFACTS / "dashboard.png")
    after = second["stats"]
    assert after["train_samples_total"] > before["train_samples_total"], (first, second)
    assert after["model_version"] > before["model_version"], (first, second)
    assert after["predict_requests_total"] > 0, second
    assert after["predict_server_errors_total"] == after["predict_client_errors_total"] == 0
    assert after["samples_per_s"] > 0 and after["latency_p50_ms"] > 0, second
    assert second["points"]["samples"] > first["points"]["samples"], (first, second)
    assert second["points"]["loss"] > 0 and second["points"]["latency"] > 0, second
    assert "weights_age" not in second["points"], "replica-only chart on the learner"


def check_replica_page(browser: Browser, url: str) -> None:
    first = open_page(browser, url, lambda p: p["stats"]["weights_age_seconds"] is not None)
    assert first["title"] == "livefit \u2013 replica"

    def moved(page: Page) -> bool:  # the page has followed the replica's new versions
        return (bool(page["stats"]["latency_p50_ms"])
                and page["stats"]["serving_version"] > first["stats"]["serving_version"]
                and page["points"]["weights_age"] > first["points"]["weights_age"])  # fmt: skip

    second = read_until(browser, moved, 30)
    browser.screenshot(ARTIFACTS / "dashboard-replica.png")
    assert second["stats"]["serving_version"] > first["stats"]["serving_version"], (first, second)
    assert second["stats"]["predict_requests_total"] > 0, second
    assert second["points"]["weights_age"] > first["points"]["weights_age"], (first, second)
    assert "loss" not in second["points"], "learner-only chart on a replica"


def test_dashboard_in_a_browser(broker: Mosquitto, tmp_path: Path) -> None:
    binary = chromium_binary()
    config = learner_config(broker, tmp_path / "data")
    learner = LivefitProcess(config, tmp_path).start()
    replica = LivefitProcess(config, tmp_path, command="replica")
    browser: Browser | None = None
    try:
        replica.start()
        browser = Browser(binary, tmp_path)
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        with Feeder(broker, [learner.url, replica.url], "dashboard/demo/samples"):
            check_learner_page(browser, f"{learner.url}/")
            assert browser.errors() == []
            check_replica_page(browser, f"{replica.url}/")
            assert browser.errors() == []
    finally:
        if browser is not None:
            browser.close()
        replica.stop()
        assert learner.stop() == 0


def test_the_status_line_says_why_the_process_is_not_ready(tmp_path: Path) -> None:
    """Readiness's problems (here the broker unreachable) are in ``api/stats`` and in the page's
    status line, in red, instead of "live"."""
    binary = chromium_binary()
    problem = (
        "model demo: MQTT broker at mqtt://127.0.0.1:9 unreachable (3 connection attempts failed)"
    )
    app = FastAPI()
    app.include_router(
        build_dashboard_router(fill_metrics(), lambda: ["demo"], "learner", lambda: [problem])
    )
    server = InProcessServer(app).start()
    browser: Browser | None = None
    try:
        assert httpx.get(f"{server.url}/api/stats").json()["problems"] == [problem]
        browser = Browser(binary, tmp_path)
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", url=f"{server.url}/")
        browser.wait_event("Page.loadEventFired")
        read = "(() => { const s = document.getElementById('status'); " \
            "return {polls: Number(document.body.dataset.polls || 0), status: s.className, " \
            "text: s.textContent}; })()"  # fmt: skip
        deadline = time.monotonic() + 15
        page = browser.evaluate(read)
        while page["polls"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
            page = browser.evaluate(read)
        assert page["status"] == "bad" and page["text"] == f"not ready: {problem}", page
        assert browser.errors() == []
    finally:
        if browser is not None:
            browser.close()
        server.stop()
