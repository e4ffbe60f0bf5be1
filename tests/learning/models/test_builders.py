"""Every built-in builder (and a custom one) trains: its held-out loss falls 5x over 300 batches."""

from __future__ import annotations

import keras

from tests.unit.models.test_builders import Case, LinearStream, _mse, cases

TRAIN_BATCHES = 300


@cases
def test_trains_and_loss_falls(case: Case) -> None:
    model = case.build(seed=0)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    stream = LinearStream(case, seed=1)
    x_test, y_test = stream.batch(256)
    before = _mse(model, x_test, y_test)
    for _ in range(TRAIN_BATCHES):
        model.train_on_batch(*stream.batch())
    after = _mse(model, x_test, y_test)
    assert after * 5 <= before, f"held-out mse {before:.4f} -> {after:.4f}, expected a 5x fall"
