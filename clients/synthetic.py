"""Sample sources for the publisher: learnable synthetic streams and files of samples.

Every source yields float32 arrays ``x`` of shape [n, *input_shape] and ``y`` of shape
[n, *target_shape]. The synthetic streams are deterministic for a seed, so a test or a demo can
check what a model learned against the true function.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np


class SampleStream(Protocol):
    """Anything that makes batches of samples of fixed shapes."""

    @property
    def input_shape(self) -> tuple[int, ...]: ...

    @property
    def target_shape(self) -> tuple[int, ...]: ...

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]: ...


class _NoisyLinear:
    """The part both streams share: weights, bias and noise fixed by a seed."""

    def __init__(self, input_dim: int, output_dim: int, noise: float, seed: int) -> None:
        if input_dim < 1 or output_dim < 1:
            raise ValueError(f"dimensions must be >= 1, got input {input_dim}, output {output_dim}")
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        params, data = np.random.SeedSequence(seed).spawn(2)
        param_rng = np.random.default_rng(params)
        weights = param_rng.normal(size=(input_dim, output_dim)) / math.sqrt(input_dim)
        self.weights = weights.astype(np.float32)
        self.bias = (0.1 * param_rng.normal(size=output_dim)).astype(np.float32)
        self.noise = noise
        self._rng = np.random.default_rng(data)

    @property
    def target_shape(self) -> tuple[int, ...]:
        return (self.weights.shape[1],)

    def _targets(self, features: np.ndarray) -> np.ndarray:
        noise = self.noise * self._rng.standard_normal((len(features), self.weights.shape[1]))
        return (features @ self.weights + self.bias + noise).astype(np.float32)


class LinearStream(_NoisyLinear):
    """y = x @ weights + bias + noise, with x ~ N(0, 1) and weights, bias fixed by ``seed``.

    Two streams with the same arguments produce the same samples in the same order. Weights are
    scaled by 1/sqrt(input_dim), so targets have roughly unit variance for any input_dim.
    """

    def __init__(
        self, input_dim: int, output_dim: int = 1, noise: float = 0.01, seed: int = 0
    ) -> None:
        super().__init__(input_dim, output_dim, noise, seed)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.weights.shape[0],)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` samples: x float32 [n, input_dim], y float32 [n, output_dim]."""
        x = self._rng.standard_normal((n, *self.input_shape), dtype=np.float32)
        return x, self._targets(x)


class SequenceStream(_NoisyLinear):
    """Sequences x [T, F] ~ N(0, 1); y = mean of x over time @ weights + bias + noise.

    The input shape an LSTM takes. Weights are scaled by sqrt(T / F), so targets have roughly
    unit variance; deterministic for ``seed`` like LinearStream.
    """

    def __init__(
        self,
        timesteps: int,
        features: int,
        output_dim: int = 1,
        noise: float = 0.01,
        seed: int = 0,
    ) -> None:
        if timesteps < 1:
            raise ValueError(f"timesteps must be >= 1, got {timesteps}")
        super().__init__(features, output_dim, noise, seed)
        self.weights *= np.float32(math.sqrt(timesteps))
        self.timesteps = timesteps

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.timesteps, self.weights.shape[0])

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` sequences: x float32 [n, T, F], y float32 [n, output_dim]."""
        x = self._rng.standard_normal((n, *self.input_shape), dtype=np.float32)
        return x, self._targets(x.mean(axis=1))


def stream_for_shape(
    input_shape: tuple[int, ...], output_dim: int = 1, noise: float = 0.01, seed: int = 0
) -> LinearStream | SequenceStream:
    """A LinearStream for [F] or a SequenceStream for [T, F]; ValueError for other ranks."""
    if len(input_shape) == 1:
        return LinearStream(input_shape[0], output_dim, noise, seed)
    if len(input_shape) == 2:
        return SequenceStream(input_shape[0], input_shape[1], output_dim, noise, seed)
    raise ValueError(
        f"synthetic data supports input shapes [F] or [T, F], got {list(input_shape)}; "
        "publish a .npz file for other shapes"
    )


def load_file(path: str | Path, target_columns: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Samples from .npz (arrays "x" and "y"), .npy or .csv (2-D, last columns are y).

    Returns float32 arrays with the same number of rows. Raises ValueError naming the file
    when it is empty, non-numeric, non-finite or of the wrong shape.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise ValueError(f"{path}: missing arrays {sorted(missing)} (has {archive.files})")
            x, y = archive["x"], archive["y"]
    elif suffix == ".npy":
        x, y = _split_columns(np.load(path, allow_pickle=False), target_columns, path)
    elif suffix == ".csv":
        x, y = _split_columns(_read_csv(path), target_columns, path)
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; use .npz, .npy or .csv")
    return _checked(x, "x", path), _checked(y, "y", path, rows=len(x))


def _split_columns(
    table: np.ndarray, target_columns: int, path: Path
) -> tuple[np.ndarray, np.ndarray]:
    if table.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D table, got shape {list(table.shape)}")
    if not 1 <= target_columns < table.shape[1]:
        raise ValueError(
            f"{path}: target_columns={target_columns} must leave at least one input column "
            f"of {table.shape[1]}"
        )
    return table[:, :-target_columns], table[:, -target_columns:]


def _read_csv(path: Path) -> np.ndarray:
    with path.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if rows and not _is_numeric_row(rows[0]):
        rows = rows[1:]  # a header
    if not rows:
        raise ValueError(f"{path}: no samples")
    try:
        return np.array([[float(cell) for cell in row] for row in rows], dtype=np.float32)
    except ValueError as exc:
        raise ValueError(f"{path}: non-numeric or ragged rows ({exc})") from None


def _is_numeric_row(row: list[str]) -> bool:
    try:
        [float(cell) for cell in row]
    except ValueError:
        return False
    return True


def _checked(array: np.ndarray, name: str, path: Path, rows: int | None = None) -> np.ndarray:
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{path}: {name} must be numeric, got dtype {array.dtype}")
    if array.ndim == 0 or len(array) == 0:
        raise ValueError(f"{path}: {name} holds no samples")
    if rows is not None and len(array) != rows:
        raise ValueError(f"{path}: x has {rows} samples but y has {len(array)}")
    array = array.astype(np.float32)
    bad = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(
            f"{path}: {name} has {int(bad.sum())} samples with NaN or infinity (first: {first})"
        )
    return array


def cycle_chunks(
    x: np.ndarray, y: np.ndarray, count: int, chunk_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``count`` samples from x, y in order, in chunks of ``chunk_size``, wrapping around."""
    start = 0
    while start < count:
        size = min(chunk_size, count - start)
        index = np.arange(start, start + size) % len(x)
        yield x[index], y[index]
        start += size


def stream_chunks(
    stream: SampleStream, count: int, chunk_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``count`` samples from ``stream``, made ``chunk_size`` at a time."""
    for start in range(0, count, chunk_size):
        yield stream.sample(min(chunk_size, count - start))
