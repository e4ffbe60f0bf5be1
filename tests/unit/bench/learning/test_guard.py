"""The guard's drift benchmark (``bench.learning.guard``): each model the user's table with the
guard on and its seed; a row read from the learner's metrics of that model only; the table sums
holds and takes the most samples held over a stream's seeds."""

from __future__ import annotations

import numpy as np

from bench.learning.guard import markdown, model_name, row, tables
from bench.learning.streams import STREAMS, Stream


def stream(name: str = "agrawal_abrupt", n: int = 5) -> Stream:
    spec = STREAMS[name]
    x = np.zeros((n, 3), np.float32)
    return Stream(spec, 42, [], ("a", "b", "c"), x, np.zeros((n, 1), np.float32), (False, True))


def test_each_model_is_the_users_table_with_the_guard_on_and_its_seed() -> None:
    found = tables({"agrawal_abrupt": stream()}, (1, 7))
    assert set(found) == {model_name("agrawal_abrupt", 1), model_name("agrawal_abrupt", 7)}
    table = found[model_name("agrawal_abrupt", 7)]
    assert table == {**stream().table(), "seed": 7, "guard": {"enabled": True}}


def test_a_row_counts_holds_and_held_samples_and_says_whether_it_still_holds() -> None:
    quiet = row(stream(), 1, {"livefit_guard_held_version": -1.0}, 0.9)
    assert (quiet["holds"], quiet["held_samples"], quiet["held_at_end"]) == (0, 0, False)
    held = {
        "livefit_guard_holds_total": 2.0,
        "livefit_guard_held_samples_total": 340.0,
        "livefit_guard_held_version": 12.0,
    }
    found = row(stream(), 3, held, 0.8)
    assert (found["holds"], found["held_samples"], found["held_at_end"]) == (2, 340, True)
    assert found["samples"] == 5 and found["metric"] == "accuracy"


def test_the_table_sums_holds_and_takes_the_most_held_of_a_seed() -> None:
    rows = [
        row(
            stream(),
            1,
            {"livefit_guard_holds_total": 1, "livefit_guard_held_samples_total": 40},
            0.9,
        ),
        row(
            stream(),
            2,
            {"livefit_guard_holds_total": 2, "livefit_guard_held_samples_total": 90},
            0.9,
        ),
    ]
    assert "| agrawal_abrupt | 5 | 2 | 3 | 90 | 0 |" in markdown(rows).splitlines()
