"""Synthetic streams and sample files (``clients.synthetic``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from livefit.clients.synthetic import LinearStream, SequenceStream, cycle_chunks, load_file


def test_linear_stream_is_deterministic_for_a_seed() -> None:
    first, second = LinearStream(8, seed=5), LinearStream(8, seed=5)
    for n in (1, 10, 100):
        for a, b in zip(first.sample(n), second.sample(n), strict=True):
            np.testing.assert_array_equal(a, b)
    x, y = LinearStream(8, seed=6).sample(100)
    assert not np.array_equal(y, second.sample(100)[1])
    assert (x.dtype, y.dtype, x.shape, y.shape) == (np.float32, np.float32, (100, 8), (100, 1))


def test_least_squares_recovers_the_linear_stream() -> None:
    stream = LinearStream(6, output_dim=2, noise=0.01, seed=1)
    x, y = stream.sample(4000)
    design = np.hstack([x, np.ones((len(x), 1), dtype=np.float32)])
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    # Standard error of each coefficient is noise / sqrt(n) ~ 1.6e-4; allow many of those.
    np.testing.assert_allclose(solution[:-1], stream.weights, atol=2e-3)
    np.testing.assert_allclose(solution[-1], stream.bias, atol=2e-3)
    residual = y - design @ solution
    assert 0.008 < residual.std() < 0.012


def test_sequence_stream_targets_follow_the_time_mean() -> None:
    stream = SequenceStream(20, 3, noise=0.0, seed=2)
    x, y = stream.sample(500)
    assert x.shape == (500, 20, 3) and stream.input_shape == (20, 3)
    np.testing.assert_allclose(y, x.mean(axis=1) @ stream.weights + stream.bias, atol=1e-5)
    assert 0.5 < y.std() < 2.0  # scaled to about unit variance


def test_load_csv_with_and_without_header(tmp_path: Path) -> None:
    table = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=np.float32)
    body = "\n".join(",".join(str(v) for v in row) for row in table) + "\n"
    (tmp_path / "plain.csv").write_text(body)
    (tmp_path / "header.csv").write_text("a,b,c,target\n" + body)
    for name in ("plain.csv", "header.csv"):
        x, y = load_file(tmp_path / name, target_columns=2)
        np.testing.assert_array_equal(x, table[:, :2])
        np.testing.assert_array_equal(y, table[:, 2:])
        assert x.dtype == y.dtype == np.float32


def test_load_npy_and_npz(tmp_path: Path) -> None:
    table = np.arange(15, dtype=np.float64).reshape(5, 3)
    np.save(tmp_path / "t.npy", table)
    x, y = load_file(tmp_path / "t.npy")
    np.testing.assert_array_equal(x, table[:, :2])
    np.testing.assert_array_equal(y, table[:, 2:])
    sequences, targets = np.ones((5, 4, 2)), np.arange(5.0)
    np.savez(tmp_path / "s.npz", x=sequences, y=targets)
    x, y = load_file(tmp_path / "s.npz")
    assert x.shape == (5, 4, 2) and x.dtype == np.float32
    np.testing.assert_array_equal(y, targets)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("bad.csv", "1,2\n3,oops\n", "non-numeric"),
        ("nan.csv", "1,2\nnan,3\n", "NaN or infinity"),
        ("one.csv", "1\n2\n", "at least one input column"),
        ("empty.csv", "a,b\n", "no samples"),
        ("data.txt", "1,2\n", "unsupported file type"),
    ],
)
def test_load_file_names_the_problem(tmp_path: Path, name: str, content: str, match: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match):
        load_file(tmp_path / name)


def test_npz_needs_x_and_y(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", inputs=np.ones((2, 2)))
    with pytest.raises(ValueError, match="missing arrays"):
        load_file(tmp_path / "a.npz")


def test_cycle_chunks_wraps_around_in_order() -> None:
    x, y = np.arange(5)[:, None], np.arange(5)
    chunks = list(cycle_chunks(x, y, count=12, chunk_size=4))
    assert [len(cx) for cx, _ in chunks] == [4, 4, 4]
    assert np.concatenate([cy for _, cy in chunks]).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
