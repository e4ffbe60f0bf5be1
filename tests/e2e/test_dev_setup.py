"""``./dev test``'s setup through the real script: apt-get runs beside pip, and neither's failure
is lost. The script runs from a scratch copy with an ``apt-get`` and a ``.venv`` of its own
(shell scripts that record what they were asked), so nothing is installed: apt-get takes a
second, so a script that did not wait for it would start pytest, or exit, before it ended.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APT_GET = """#!/bin/sh
case "$1" in
  update) exit 0 ;;
  install) /bin/touch "{started}"; /bin/sleep 1; /bin/echo "$@" > "{done}"; exit "${{APT_STATUS:-0}}" ;;
esac
"""
# what ./dev asks of its venv's python: a liveness check, pip, the site-packages for compileall,
# compileall, then pytest (which says whether apt-get had finished by then)
PYTHON = """#!/bin/sh
case "$*" in
  "-c ") exit 0 ;;
  "-m pip "*)  # waits (2 s at most) for apt-get to start, and says whether it was running
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
      [ -f "{started}" ] && break; /bin/sleep 0.1
    done
    [ -f "{done}" ] && when=after || when=beside
    /bin/echo "$* ($when apt-get)" >> "{venv}/pip.calls"; exit "${{PIP_STATUS:-0}}" ;;
  "-c import sysconfig"*) /bin/echo "{venv}/site-packages" ;;
  "-m compileall "*) /bin/echo "$*" >> "{venv}/compileall.calls"; exit 0 ;;
  "-m pytest "*) if [ -f "{done}" ]; then /bin/echo "pytest after apt-get"; else /bin/echo "pytest before apt-get"; fi ;;
esac
"""


def scratch_dev(tmp_path: Path, installed: bool) -> tuple[Path, Path, dict[str, str]]:
    """A copy of ``dev`` and pyproject.toml, the fakes on PATH, and the venv installed (its stamp
    matching pyproject.toml) or not; the apt-get marker's path and the environment."""
    checkout, fakes, venv = tmp_path / "checkout", tmp_path / "bin", tmp_path / "checkout/.venv"
    (venv / "bin").mkdir(parents=True)
    fakes.mkdir()
    shutil.copy2(ROOT / "dev", checkout / "dev")
    shutil.copy2(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    done = tmp_path / "apt-get.done"
    for path, text in ((fakes / "apt-get", APT_GET), (venv / "bin/python", PYTHON)):
        path.write_text(text.format(done=done, started=tmp_path / "apt-get.started", venv=venv))
        path.chmod(0o755)
    (fakes / "id").write_text("#!/bin/sh\n/bin/echo 0\n")  # as root, whoever runs the test
    (fakes / "id").chmod(0o755)
    for tool in ("python3", "sha256sum", "cut", "dirname", "rm", "touch", "tail"):
        found = shutil.which(tool) if tool != "python3" else sys.executable
        assert found, tool
        (fakes / tool).symlink_to(found)
    if installed:
        stamp = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()[:16]
        (venv / f".installed-{stamp}").touch()
    # without /usr/bin on PATH the tests' tools (chromium, wrk...) are missing: apt-get is asked
    env = {"PATH": str(fakes), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return checkout, done, env


def run_dev(checkout: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    """``./dev test --version``, returned as soon as the script exits (its output goes to files:
    a pipe would also wait for a background apt-get that still held it open)."""
    out, err = checkout.parent / "dev.out", checkout.parent / "dev.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            ["/bin/bash", str(checkout / "dev"), "test", "--version"], env={**env, **extra},
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        status = process.wait(timeout=60)
    return subprocess.CompletedProcess(process.args, status, out.read_text(), err.read_text())


@pytest.fixture(autouse=True)
def _bash() -> None:
    if not Path("/bin/bash").exists() or not Path("/bin/sh").exists():
        pytest.skip("needs /bin/bash and /bin/sh")


def test_pip_installs_without_compiling_then_compileall_and_pytest_waits_for_apt_get(
    tmp_path: Path,
) -> None:
    checkout, done, env = scratch_dev(tmp_path, installed=False)
    result = run_dev(checkout, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pytest after apt-get"
    assert "install -y -qq --no-install-recommends" in done.read_text()
    pip = (checkout / ".venv/pip.calls").read_text().splitlines()
    assert pip[-1] == "-m pip install --no-compile -e .[dev] (beside apt-get)", pip
    compiled = (checkout / ".venv/compileall.calls").read_text()
    assert compiled.strip() == f"-m compileall -q -j 0 {checkout / '.venv/site-packages'}"
    assert list(checkout.glob(".venv/.installed-*")), "the install is stamped"


def test_a_failed_apt_get_fails_the_setup_after_the_venv_and_runs_no_test(tmp_path: Path) -> None:
    checkout, done, env = scratch_dev(tmp_path, installed=True)
    result = run_dev(checkout, env, APT_STATUS="100")
    assert result.returncode == 100, (result.stdout, result.stderr)
    assert "pytest" not in result.stdout
    assert done.exists()


def test_a_failed_pip_waits_for_apt_get_before_it_exits(tmp_path: Path) -> None:
    checkout, done, env = scratch_dev(tmp_path, installed=False)
    result = run_dev(checkout, env, PIP_STATUS="1")
    assert result.returncode == 1
    assert "pip failed" in result.stderr and "pytest" not in result.stdout
    assert done.exists(), "./dev exited while apt-get was still installing"
    assert not list(checkout.glob(".venv/.installed-*")), "a failed install is not stamped"


def test_without_pythons_venv_module_apt_get_goes_first(tmp_path: Path) -> None:
    """python3-venv comes from apt-get, so pip cannot start beside it."""
    checkout, done, env = scratch_dev(tmp_path, installed=True)
    (tmp_path / "bin/python3").unlink()
    (tmp_path / "bin/python3").write_text(
        f'#!/bin/sh\n[ -f "{done}" ] || exit 1\nexec {sys.executable} "$@"\n'
    )  # no venv module until apt-get has run
    (tmp_path / "bin/python3").chmod(0o755)
    result = run_dev(checkout, env)
    assert result.returncode == 0, result.stderr
    assert "python3-venv" in done.read_text()
    assert result.stdout.strip() == "pytest after apt-get"
