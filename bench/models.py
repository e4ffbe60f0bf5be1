"""The models every side of a comparison uses: same builder, shapes, options and seed.

A peer builds its network with ``livefit.models.build_model`` and the same seed as livefit's
config, so every server starts from the same weights; the serving benchmark checks that they
all answer the same numbers for the same request before it measures anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One benchmark model: what livefit's config and every peer's builder call receive."""

    name: str
    builder: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = 7
    loss: str = "mse"
    optimizer: str = "adam"
    learning_rate: float = 0.001
    # livefit's default: every side of a comparison runs the same network, the Standardize layer
    # in front included (it is the identity until a learner has seen data)
    scaling: str = "standardize"
    # livefit's default too: what it serves is the network and the linear expert in their
    # mixture (livefit.models.experts), so every side computes that same model
    experts: bool = True

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        shape = "x".join(str(d) for d in self.input_shape)
        return (
            f"{self.builder} ({opts or 'defaults'}), input {shape}, output {self.output_shape[0]}"
            + (", Standardize layer in front" if self.scaling == "standardize" else "")
            + (", with the linear expert beside it" if self.experts else "")
        )

    def build(self, compiled: bool = False):
        """The Keras network (``compiled``: with livefit's optimizer and loss)."""
        import keras

        from livefit.models.builders import build_model

        model = build_model(
            self.builder,
            self.input_shape,
            self.output_shape,
            self.options,
            seed=self.seed,
            scaling=self.scaling,
            experts=self.experts,
        )
        if compiled:
            optimizer = keras.optimizers.get(
                {"class_name": self.optimizer, "config": {"learning_rate": self.learning_rate}}
            )
            model.compile(optimizer=optimizer, loss=self.loss)
        return model

    def cli_args(self) -> list[str]:
        """How a peer process is told which model to build (see ``from_cli``)."""
        return ["--model-spec", json.dumps(self.to_json())]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "builder": self.builder,
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
            "options": self.options,
            "seed": self.seed,
            "loss": self.loss,
            "optimizer": self.optimizer,
            "learning_rate": self.learning_rate,
            "scaling": self.scaling,
            "experts": self.experts,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(
            name=data["name"],
            builder=data["builder"],
            input_shape=tuple(data["input_shape"]),
            output_shape=tuple(data["output_shape"]),
            options=dict(data["options"]),
            seed=data["seed"],
            loss=data["loss"],
            optimizer=data["optimizer"],
            learning_rate=data["learning_rate"],
            scaling=data.get("scaling", "standardize"),
            experts=data.get("experts", True),
        )

    def table(self) -> dict[str, Any]:
        """This model's ``[models.<name>]`` table for a livefit config (``bench.config``)."""
        table = self.to_json()
        del table["name"]
        table["builder_options"] = table.pop("options")
        if not table.pop("experts"):
            table["experts"] = {"enabled": False}
        return table

    def rows(self, n: int, seed: int = 1) -> np.ndarray:
        """``n`` deterministic float32 inputs."""
        rng = np.random.default_rng(seed)
        return rng.standard_normal((n, *self.input_shape), dtype=np.float32)

    def request_body(self, seed: int = 1) -> bytes:
        """One TF Serving ``:predict`` request of one row: the body every server receives."""
        row = np.round(self.rows(1, seed).astype(np.float64), 4)
        return json.dumps({"instances": row.tolist()}, separators=(",", ":")).encode()

    def predict_path(self) -> str:
        return f"/v1/models/{self.name}:predict"


MLP = ModelSpec("mlp", "mlp", (8,), (1,), {"hidden_units": [64, 64]})
LSTM = ModelSpec("lstm", "lstm", (16, 8), (1,), {"units": 64})
