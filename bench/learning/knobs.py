"""livefit's learning settings under test, and the named sets of them the benchmark compares."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from bench.learning.streams import BINARY, LOSSES

MODEL_SEED = 7  # the reference seed: the server's figures
BINARY_TABLE = {"input_shape": [1], "output_shape": [1], "loss": LOSSES[BINARY]}


@dataclass(frozen=True, slots=True)
class Knobs:
    """The learning settings under test; ``None`` leaves livefit's default in place (and out
    of the model's table: what is not set here is not written)."""

    builder: str | None = None
    activation: str | None = None  # the MLP's hidden activation (builder option)
    hidden_units: tuple[int, ...] | None = None  # the MLP's hidden layers (builder option)
    optimizer: str | None = None
    learning_rate: float | None = None
    steps_per_batch: int | None = None
    replay_capacity: int | None = None
    replay_mode: str | None = None
    replay_share: float | None = None
    scaling: str | None = None
    target_scaling: str | None = None
    drift_reaction: str | None = None
    drift_threshold: float | None = None
    boost_factor: float | None = None
    boost_steps: int | None = None
    start_lr_factor: float | None = None
    fast_start_samples: int | None = None
    start_steps: int | None = None
    weight_average: float | None = None
    seed: int = MODEL_SEED

    def model_config(self, table: dict[str, Any]) -> dict[str, Any]:
        """The ``[models.<name>]`` table (as a dict): the user's ``table`` (shapes and loss),
        the model seed, and these knobs where set."""
        config: dict[str, Any] = {**table}
        if self.builder is not None:
            config["builder"] = self.builder
        options: dict[str, Any] = {}
        if self.activation is not None:
            options["activation"] = self.activation
        if self.hidden_units is not None:
            options["hidden_units"] = list(self.hidden_units)
        if options:
            config["builder_options"] = options
        config["seed"] = self.seed
        for key in ("optimizer", "learning_rate", "scaling", "target_scaling"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        train = {
            k: getattr(self, k)
            for k in (
                "steps_per_batch",
                "replay_capacity",
                "replay_mode",
                "replay_share",
                "start_lr_factor",
                "fast_start_samples",
                "start_steps",
                "weight_average",
            )
            if getattr(self, k) is not None
        }
        if train:
            config["train"] = train
        drift = {
            k: v
            for k, v in (
                ("reaction", self.drift_reaction),
                ("threshold", self.drift_threshold),
                ("boost_factor", self.boost_factor),
                ("boost_steps", self.boost_steps),
            )
            if v is not None
        }
        if drift:
            config["drift"] = drift
        return config

    def resolved(self) -> dict[str, Any]:
        """The effective learning settings: these knobs over livefit's defaults."""
        from livefit.server.config.model import ModelSettings

        s = ModelSettings.model_validate(self.model_config(BINARY_TABLE))
        # None: livefit's default capacity, which depends on the loss (2,000 for regression,
        # else 500)
        capacity = s.train.replay_capacity
        replay = (capacity is None or capacity > 0) and s.train.replay_share > 0
        return {
            "builder": s.builder,
            **_builder_facts(s.builder, s.builder_options),
            "optimizer": s.optimizer,
            "learning_rate": s.learning_rate,
            # None: livefit's default, which depends on the loss (4 for regression, else 2)
            "steps_per_batch": s.train.steps_per_batch,
            "replay_capacity": capacity if replay else 0,
            "replay_mode": s.train.replay_mode if replay else None,
            "replay_share": s.train.replay_share if replay else 0.0,
            "scaling": s.scaling,
            "target_scaling": self.target_scaling,  # None: the loss's default
            "drift_reaction": s.drift.reaction,
            "drift_threshold": s.drift.threshold,
            "boost_factor": s.drift.boost_factor,
            "boost_steps": s.drift.boost_steps,
            "start_lr_factor": s.train.start_lr_factor,
            # None: livefit's default, which depends on the loss (100 for regression, else 0)
            "fast_start_samples": s.train.fast_start_samples,
            "start_steps": s.train.start_steps,
            "weight_average": s.train.weight_average,
        }

    def key(self) -> str:
        """Identifies the effective settings and seed (knobs spelled differently, same key)."""
        return json.dumps([self.resolved(), self.seed], sort_keys=True)

    def label(self) -> str:
        """A short human label of the effective settings."""
        return describe(self.resolved())


def describe(r: dict[str, Any]) -> str:
    """``mlp relu, adam lr 0.003, 2 steps, replay reservoir 2000 x 0.5`` for resolved settings."""
    model = r["builder"]
    if model == "mlp":
        model = f"mlp {r['activation']}"
        if r["hidden_units"] != [64, 64]:
            model += f" {'x'.join(str(u) for u in r['hidden_units'])}"
    parts = [
        model,
        f"{r['optimizer']} lr {r['learning_rate']:g}",
        _steps(r["steps_per_batch"]),
    ]
    if r["replay_capacity"] is None:  # livefit's default: by the loss's kind
        from livefit.server.config.model import REGRESSION_REPLAY_CAPACITY, REPLAY_CAPACITY

        capacity = f"{REPLAY_CAPACITY} ({REGRESSION_REPLAY_CAPACITY} for regression)"
        parts.append(f"replay {r['replay_mode']} {capacity} x {r['replay_share']:g}")
    elif r["replay_capacity"]:
        parts.append(f"replay {r['replay_mode']} {r['replay_capacity']} x {r['replay_share']:g}")
    else:
        parts.append("no replay")
    if r["scaling"] != "standardize":
        parts.append(f"scaling {r['scaling']}")
    if r.get("target_scaling") is not None:
        parts.append(f"target scaling {r['target_scaling']}")
    if r.get("start_lr_factor", 1) > 1:
        parts.append(f"start lr x{r['start_lr_factor']:g} over {r['start_steps']} steps")
    if r.get("fast_start_samples", 0) is None:  # livefit's default: by the loss's kind
        from livefit.server.config.model import REGRESSION_FAST_START_SAMPLES

        parts.append(f"fast start {REGRESSION_FAST_START_SAMPLES} for regression")
    elif r.get("fast_start_samples"):
        parts.append(f"fast start {r['fast_start_samples']}")
    if r.get("weight_average"):
        parts.append(f"averaged weights {r['weight_average']:g}")
    if r["drift_reaction"] != "none":  # the threshold only matters when drift changes learning
        reaction = r["drift_reaction"]
        if reaction in ("boost_lr", "recover") and "boost_factor" in r:
            reaction += f" x{r['boost_factor']:g} over {r['boost_steps']} steps"
        parts.append(f"on drift (threshold {r['drift_threshold']:g}) {reaction}")
    return ", ".join(parts)


def _builder_facts(builder: str, options: dict[str, Any]) -> dict[str, Any]:
    """The MLP's hidden units and activation, with the builder's defaults filled in."""
    if builder != "mlp":
        return {"hidden_units": None, "activation": None}
    from livefit.models.builders import _DEFAULT_OPTIONS

    defaults = _DEFAULT_OPTIONS["mlp"]
    return {
        "hidden_units": list(options.get("hidden_units", defaults["hidden_units"])),
        "activation": options.get("activation", defaults["activation"]),
    }


DEFAULTS = Knobs()  # whatever livefit's defaults are when the benchmark runs: the user's config
V01 = Knobs(  # livefit 0.1's defaults, explicitly: the "before" of the issue
    activation="relu",
    optimizer="adam",
    learning_rate=0.001,
    steps_per_batch=1,
    replay_capacity=0,
    scaling="standardize",
    drift_reaction="none",
    weight_average=0.0,
    fast_start_samples=0,
)
# The defaults before the recent-window replay (the previous recommendation), for comparison.
PREVIOUS = replace(V01, optimizer="nadam", learning_rate=0.01)
# Chosen from the sweep below (see BENCHMARKS.md, "Learning quality"); spelled out, not taken
# from livefit's defaults, so that this stays what was measured when the defaults change.
RECOMMENDED = replace(
    PREVIOUS,
    activation="tanh",
    steps_per_batch=2,
    replay_capacity=500,
    replay_mode="window",
    replay_share=0.75,
)
# The defaults before fast starts and drift recovery (issue #30): no start boost, and drift
# only logged and counted.
BEFORE_RECOVERY = Knobs(
    start_lr_factor=1.0, drift_reaction="none", weight_average=0.0, steps_per_batch=2,
    replay_capacity=500, fast_start_samples=0,
)  # fmt: skip  # 2 steps and 500 replayed for every loss before regression's own defaults
# Regression as before online target scaling: the network learns the raw targets.
NO_TARGET_SCALING = Knobs(target_scaling="none")


def _steps(steps: int | None) -> str:
    """``2 steps``; livefit's default (None): by the loss's kind."""
    if steps is None:
        from livefit.server.config.model import REGRESSION_STEPS_PER_BATCH, STEPS_PER_BATCH

        return f"{STEPS_PER_BATCH} steps ({REGRESSION_STEPS_PER_BATCH} for regression)"
    return f"{steps} step{'s' if steps > 1 else ''}"
