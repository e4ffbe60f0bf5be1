"""README's "Your own model" commands run as written, in bash (the static checks of README:
``tests/unit/repo/test_readme.py``). Three things differ, so that a test never touches what others
run on this machine: the learner gets the test's mosquitto and a free port (two lines added to
``my.toml``), ``localhost:8000`` is that port, and ``livefit publish`` gets ``--broker``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto

ROOT = Path(__file__).resolve().parents[2]
SECTION = (ROOT / "README.md").read_text().split("## Your own model")[1].split("\n## ")[0]
COMMANDS = re.search(r"```bash\n(.+?)```", SECTION, re.S).group(1).splitlines()  # type: ignore[union-attr]
BIN = str(Path(sys.executable).parent)


def as_run_here(port: int, broker: str | None = None) -> list[str]:
    """README's commands with this checkout's virtualenv, the port, and the broker."""
    lines = []
    for line in COMMANDS:
        line = line.replace(".venv/bin", BIN).replace("localhost:8000", f"localhost:{port}")
        if broker is not None and " publish " in line:
            line = line.replace(" publish ", f" publish --broker {broker} --no-progress ", 1)
        lines.append(line)
        if line.startswith("printf ") and broker is not None:
            lines.append(
                f"printf '[broker]\\nurl = \"{broker}\"\\n[http]\\nport = {port}\\n' >> my.toml"
            )
    return lines


def bash(lines: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", "\n".join(lines)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_wait_loop_ends_when_serve_died(tmp_path: Path) -> None:
    """A typo in the config: ``serve`` exits 2 at once, and README's loop used to wait for
    it forever (issue 45). Now it ends, and serve.log says why."""
    lines = as_run_here(free_port())
    serve = next(i for i, line in enumerate(lines) if " serve " in line)
    typo = "printf 'lerning_rate = 0.01\\n' >> my.toml"  # the model's table is the file's last
    assert lines[serve + 1].startswith("until curl")
    done = bash([*lines[:serve], typo, *lines[serve : serve + 2], "echo waited"], tmp_path,
                timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "waited", done.stderr
    said = (tmp_path / "serve.log").read_text()
    assert "models.sensor.lerning_rate: unknown key; did you mean 'learning_rate'?" in said, said


def test_the_own_model_example_learns_and_stops(broker: Mosquitto, tmp_path: Path) -> None:
    """The learner starts, ``livefit publish`` sends the CSV (exit 0, no warning), the
    prediction is about the truth (0.6) and names a version, ``kill %1`` stops the learner
    with exit 0."""
    port = free_port()
    done = bash([*as_run_here(port, broker.url), "wait %1", 'echo "serve exit $?"'], tmp_path,
                timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "published 5000 samples in 5000 messages" in done.stdout, done.stdout
    assert "warning" not in done.stderr and "error" not in done.stderr, done.stderr
    answer = re.search(r'\{"predictions":.*?"model_version":"\d+"\}', done.stdout)
    assert answer is not None, done.stdout
    body = json.loads(answer.group())
    version = int(body["model_version"])
    print(f"\nREADME's example: {body}")
    assert abs(body["predictions"][0][0] - 0.6) < 0.15
    # README gives the versions of its authors' runs; a version is one training step, and
    # how many the 5,000 rows take depends on how they fall into minibatches.
    assert 10 <= version <= 2000
    assert done.stdout.strip().endswith("serve exit 0")
