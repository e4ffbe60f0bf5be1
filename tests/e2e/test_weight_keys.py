"""Weight keys as the processes that use them meet them: the key command compose runs before
the services (made once, private, kept), four processes making a storage's key at once (one
makes it, all end with it, nothing half-written), and a garbage key file in each place a key
is read (one line naming it and exit 2, before anything starts). The envelope, keys and
verification in process: ``tests/unit/weights/`` (``test_receiver.py``, ``test_keys.py``,
``test_receiver_auth.py``).
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from livefit.server.weights.keys import (
    SigningKey,
    default_key_path,
    default_public_path,
    parse_verify_key,
)


def test_key_init_command_for_compose(tmp_path: Path) -> None:
    private, public = tmp_path / "signing" / "k", tmp_path / "verify" / "k.pub"
    command = [
        sys.executable,
        "-m",
        "livefit.server.weights.keys",
        str(private),
        str(public),
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    verify = parse_verify_key(public.read_bytes())
    assert verify.base64() in first.stdout and "created" in first.stdout
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "kept" in again.stdout
    assert parse_verify_key(public.read_bytes()).key_id == verify.key_id
    assert base64.b64decode(verify.base64()) == verify.raw


def test_processes_starting_together_on_one_storage_share_one_key(tmp_path: Path) -> None:
    """Four processes making the key at once all end with the same complete key, and exactly
    one of them made it; a reader never sees a half-written private or public key file."""
    storage = tmp_path / "data"
    script = (
        "import sys; from pathlib import Path\n"
        "from livefit.server.weights.keys import *\n"
        "s = Path(sys.argv[1])\n"
        "key, made = ensure_signing_key(default_key_path(s), default_public_path(s))\n"
        "print(key.key_id, made)\n"
    )
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(storage)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = []
    for process in starts:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        outcomes.append(out.split())
    assert len({key_id for key_id, _ in outcomes}) == 1
    assert [made for _, made in outcomes].count("True") == 1
    assert parse_verify_key(default_public_path(storage).read_bytes()).key_id == outcomes[0][0]
    assert sorted(p.name for p in (storage / "keys").iterdir()) == [
        default_key_path(storage).name,
        default_public_path(storage).name,
    ], "no temporary file is left behind"


# A garbage key file is one line naming it and exit 2, before anything starts, in each place a
# key is read: the learner's configured key, the key it made in its storage dir, a replica's
# public key file, and a PEM that is not a key (cryptography's own error, one line).
GARBAGE_KEYS = {
    "signing_key_file": ("serve", "signing_key_file = '{key}'", "{tmp}/k.key"),
    "made_key": ("serve", "", "{tmp}/data/keys/weights-signing.key"),
    "verify_key_file": ("replica", "verify_key_file = '{key}'", "{tmp}/k.pub"),
    "pem_that_is_no_key": ("serve", "signing_key_file = '{key}'", "{tmp}/k.pem"),
}


@pytest.mark.parametrize(
    ("case", "workers"),
    [(case, 1) for case in GARBAGE_KEYS] + [("signing_key_file", 0), ("made_key", 0)],
)
def test_a_garbage_key_file_is_one_line_and_exit_2(tmp_path: Path, case: str, workers: int) -> None:
    command, line, path = GARBAGE_KEYS[case]
    key = Path(path.format(tmp=tmp_path))
    key.parent.mkdir(parents=True, exist_ok=True)
    pem = case == "pem_that_is_no_key"
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n"
                    if pem else b"garbage\n")  # fmt: skip
    done = start_with_key(tmp_path, command, line.format(key=key), workers)
    assert_one_line_exit_2(done, key)
    assert done.stderr.startswith("livefit: models.demo.weights"), done.stderr


# Key files that never end (an outside attack on issue 26 item 14): ``/dev/zero`` as the
# signing key grew the learner's memory without limit, a FIFO hung it forever. Each is now
# refused before it is read: a regular file of at most 64 KiB, or one line and exit 2.
ENDLESS_KEYS = {
    "dev_zero": ("serve", "signing_key_file = '{key}'", "/dev/zero", "a character device"),
    "fifo_signing_key": ("serve", "signing_key_file = '{key}'", "{tmp}/k.key", "a FIFO"),
    "fifo_made_key": ("serve", "", "{tmp}/data/keys/weights-signing.key", "a FIFO"),
    "fifo_verify_key": ("replica", "verify_key_file = '{key}'", "{tmp}/k.pub", "a FIFO"),
    "directory": ("serve", "signing_key_file = '{key}'", "{tmp}/keys.d", "a directory"),
    "huge_file": ("serve", "signing_key_file = '{key}'", "{tmp}/k.key", "at most 64 KiB"),
}


def _limit_memory() -> None:
    """At most 3 GiB of address space: a key read that never ends fails here, not the host."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.parametrize("case", ENDLESS_KEYS)
def test_a_key_file_that_never_ends_is_refused_before_it_is_read(tmp_path: Path, case: str) -> None:
    command, line, path, said = ENDLESS_KEYS[case]
    key = Path(path.format(tmp=tmp_path))
    key.parent.mkdir(parents=True, exist_ok=True)
    if case.startswith("fifo"):
        os.mkfifo(key)
    elif case == "directory":
        key.mkdir()
    elif case == "huge_file":  # a valid key, padded past the limit
        key.write_bytes(SigningKey.generate().private_pem() + b"\n" * (64 * 1024))
    done = start_with_key(tmp_path, command, line.format(key=key), 1, limit_memory=True)
    assert_one_line_exit_2(done, key)
    assert done.stderr.startswith("livefit: models.demo.weights") and said in done.stderr


def start_with_key(
    tmp_path: Path, command: str, weights_line: str, workers: int, *, limit_memory: bool = False
) -> subprocess.CompletedProcess[str]:
    """``livefit <command>`` with a one-model config whose ``[models.demo.weights]`` has
    ``weights_line``, a broker nobody listens on (the key is checked before any connection)."""
    config = tmp_path / "livefit.toml"
    config.write_text(
        f'[http]\nworkers = {workers}\n[broker]\nurl = "mqtt://127.0.0.1:9"\n'
        f'[storage]\ndir = "{tmp_path / "data"}"\n'
        "[models.demo]\ninput_shape = [8]\noutput_shape = [1]\n"
        f"[models.demo.weights]\n{weights_line}\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "livefit", command, "--config", str(config), "--port", "0"],
        capture_output=True, text=True, timeout=120,
        preexec_fn=_limit_memory if limit_memory else None,
    )  # fmt: skip


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], key: Path) -> None:
    """Exit 2, no traceback, one line on stderr naming the key file."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert done.stderr.count("\n") == 1 and str(key) in done.stderr, output[-3000:]
