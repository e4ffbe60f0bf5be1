"""Moves from a split learner's serving process to its training process
(``runtime.control_socket``): the record comes back, a refusal keeps its status, and no
training process is a 503."""

from __future__ import annotations

from pathlib import Path

import pytest

from livefit.server.runtime.control_socket import ControlClient, ControlServer
from livefit.server.serve.version_book import Move, MoveRefused
from livefit.server.wire.serving_record import ServingRecord


def mover(name: str, move: Move) -> ServingRecord:
    if move.label == "bad":
        raise MoveRefused(404, "model m has no label 'bad'")
    return ServingRecord(name, "L", 1, labels={move.label or "": move.version or 0})


def test_a_move_crosses_and_a_refusal_keeps_its_status(tmp_path: Path) -> None:
    client = ControlClient(tmp_path)
    with pytest.raises(MoveRefused) as absent:
        client.move("m", Move("label", "stable", 3))
    assert absent.value.status == 503
    server = ControlServer(tmp_path, mover)
    server.start()
    try:
        assert client.move("m", Move("label", "stable", 3)).labels == {"stable": 3}
        with pytest.raises(MoveRefused) as refused:
            client.move("m", Move("unlabel", "bad"))
        assert refused.value.status == 404 and "bad" in refused.value.message
    finally:
        server.stop()
    assert not (tmp_path / "control.sock").exists()
