"""The runnable examples and the documentation's Python run as users run them: a real
mosquitto, ``livefit serve`` with ``examples/actor.toml`` (plus the ``demo`` model the docs
use), each script in a fresh Python process.

- ``examples/actor.py``: an actor acting with the newest weights while the learner trains on
  the experience it publishes; every step's sample is trained, the actor swaps in several
  versions, and it earns more reward in its last quarter than in its first.
- Every fenced ``python`` block of docs/http.md, with the documented addresses
  (``http://127.0.0.1:8000``, ``mqtt://127.0.0.1:1883``) pointed at this test's learner and
  broker and run in the learner's directory (its storage is ``./livefit-data`` as documented),
  so a snippet that no longer runs fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ACTOR_STEPS = 600


@pytest.fixture(scope="module")
def learner(
    broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LivefitProcess]:
    """``examples/actor.toml`` as shipped, on this test's broker, with a ``demo`` model added."""
    workdir = tmp_path_factory.mktemp("examples")
    text = (EXAMPLES / "actor.toml").read_text().replace('url = "auto"', f'url = "{broker.url}"')
    text = text.replace("[storage]", f'client_id = "examples-{broker.port}"\n\n[storage]', 1)
    text += "\n" + model("demo", builder="mlp", weights="publish_interval_s = 0.2")
    process = LivefitProcess(text, workdir, cwd=workdir).start()
    try:
        yield process
    finally:
        assert process.stop() == 0


def test_the_actor_acts_with_new_weights_while_the_learner_trains_on_its_experience(
    learner: LivefitProcess, broker: Mosquitto
) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "actor.py"), "--broker", broker.url, "--model", "actor",
         "--key", "livefit-data/keys/weights-signing.pub", "--steps", str(ACTOR_STEPS)],
        capture_output=True, text=True, timeout=240, cwd=learner.workdir,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    print("actor:", summary)
    assert summary["steps"] == ACTOR_STEPS
    trained = learner.wait_for_metric("livefit_train_samples_total", ACTOR_STEPS, model="actor")
    assert trained == ACTOR_STEPS  # every experience the actor published was learned
    assert len(summary["versions"]) >= 3, summary  # it acted with newer weights as they came
    assert summary["last_quarter_reward"] > summary["first_quarter_reward"], summary


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_the_http_docs_python_runs(learner: LivefitProcess, broker: Mosquitto) -> None:
    with SamplePublisher(broker.url, "livefit/demo/samples", fmt="msgpack") as publisher:
        x, y = LinearStream(input_dim=8, seed=1).sample(300)
        publisher.publish(x, y, batched=True)
    assert learner.wait_for_metric("livefit_train_samples_total", 300, model="demo") == 300
    blocks = python_blocks(ROOT / "docs" / "http.md")
    assert len(blocks) >= 2 and any("WeightSubscriber" in block for block in blocks)
    for block in blocks:
        code = block.replace("http://127.0.0.1:8000", learner.url)
        code = code.replace("mqtt://127.0.0.1:1883", broker.url)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=120, cwd=learner.workdir)  # fmt: skip
        assert result.returncode == 0, f"{block}\n{result.stderr[-3000:]}"
        assert result.stdout.strip(), block
        assert time.monotonic() - started < 120
