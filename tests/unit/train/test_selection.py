"""Online model selection: windowed scores per candidate, switches with hysteresis, and the
served candidate's weights in snapshots (the configured one's in checkpoints)."""

from __future__ import annotations

import math

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.placement import Placement
from livefit.server.train.selection import CandidateSet, SwitchRule
from livefit.server.train.trainer import Trainer
from livefit.server.train.update_policy import UpdatePolicy
from livefit.server.wire.samples import Batch
from livefit.server.wire.snapshot import SnapshotSlot

NAN = math.nan


def linear_settings(**selection) -> ModelSettings:
    """A linear regression whose configured learning rate barely moves it and a candidate
    ``fast`` that learns: on a linear stream ``fast`` must win (no experts: the linear expert
    would learn the stream for both)."""
    return ModelSettings.model_validate({
        "builder": "linear", "input_shape": [3], "output_shape": [1], "seed": 1,
        "optimizer": "sgd", "learning_rate": 1e-6, "target_scaling": "none",
        "experts": {"enabled": False},
        "train": {"replay_capacity": 0, "steps_per_batch": 1, "start_lr_factor": 1},
        "drift": {"enabled": False},
        "selection": {"enabled": True, "window": 64, "margin": 0.1,
                      "min_samples_between_switches": 64,
                      "candidates": [{"name": "fast", "learning_rate": 0.05}], **selection},
    })  # fmt: skip


def linear_batches(count: int, rows: int = 16, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    coef = np.array([1.5, -2.0, 0.5], np.float32)
    batches = []
    for _ in range(count):
        x = rng.normal(size=(rows, 3)).astype(np.float32)
        y = (x @ coef + 3.0).reshape(rows, 1).astype(np.float32)
        batches.append(Batch(x, y, np.ones(rows, np.float32), 1, None, None))
    return batches


def test_switch_rule_needs_the_margin_and_the_spacing() -> None:
    rule = SwitchRule(margin=0.1, min_samples_between=100)
    assert rule.choose("a", {"a": 1.0, "b": 0.5}, samples_since=99) is None  # too soon
    assert rule.choose("a", {"a": 1.0, "b": 0.5}, samples_since=100) == "b"
    assert rule.choose("a", {"a": 1.0, "b": 0.91}, samples_since=500) is None  # near tie
    assert rule.choose("a", {"a": 1.0, "b": 0.89, "c": 0.7}, samples_since=500) == "c"
    assert rule.choose("a", {"a": NAN, "b": 3.0}, samples_since=500) == "b"  # served failed
    assert rule.choose("a", {"a": 1.0, "b": NAN}, samples_since=500) is None
    assert rule.choose("a", {"a": 1.0}, samples_since=500) is None


def build_set(settings: ModelSettings) -> CandidateSet:
    placement = Placement(["/CPU:0"])
    trainer = Trainer("m", settings, SampleQueue(10), SnapshotSlot(), Metrics(), placement)
    return CandidateSet("m", settings, trainer.policy, placement)


def test_each_candidate_is_scored_on_its_own_prequential_losses() -> None:
    candidates = build_set(linear_settings())
    policies: dict[str, UpdatePolicy] = {n: c.policy for n, c in candidates.candidates.items()}
    seen: dict[str, list[np.ndarray]] = {name: [] for name in policies}
    for name, policy in policies.items():
        original = policy.learn

        def spy(batch, extras_allowed=True, _name=name, _original=original):
            learned = _original(batch, extras_allowed)
            seen[_name].append(learned.first.prequential_losses)
            return learned

        policy.learn = spy  # type: ignore[method-assign]
    for batch in linear_batches(6):
        candidates.learn(batch)
    scores = candidates.scores()
    for name, losses in seen.items():  # the window (64) holds the last 4 batches of 16
        assert math.isclose(scores[name], float(np.concatenate(losses[-4:]).mean()), rel_tol=1e-6)
    assert scores["fast"] < scores["configured"]
    assert candidates.samples == 96


def test_the_better_candidate_is_served_after_the_spacing_and_then_stays() -> None:
    candidates = build_set(linear_settings())
    switches = []
    for batch in linear_batches(40):
        candidates.learn(batch)
        switch = candidates.reconsider()
        if switch is not None:
            switches.append(switch)
    assert [(s.old, s.new) for s in switches] == [("configured", "fast")]
    assert switches[0].samples == 64  # the first time the spacing allowed it
    assert switches[0].scores["fast"] < 0.9 * switches[0].scores["configured"]
    assert candidates.served_model is candidates.candidates["fast"].model


def test_a_large_margin_keeps_the_configured_candidate() -> None:
    candidates = build_set(linear_settings(margin=0.999999))
    for batch in linear_batches(20):
        candidates.learn(batch)
        assert candidates.reconsider() is None
    assert candidates.served.name == "configured"


def test_snapshots_carry_the_served_candidate_and_checkpoints_the_configured_one(
    tmp_path,
) -> None:
    from livefit.server.storage.checkpoint import CheckpointStore

    settings = linear_settings()
    slot = SnapshotSlot()
    store = CheckpointStore(tmp_path, "m")
    trainer = Trainer("m", settings, SampleQueue(10), slot, Metrics(), "/CPU:0", store)
    trainer.warm_up()
    for batch in linear_batches(10):
        trainer.train_batch(batch)
    assert trainer.candidates is not None and trainer.candidates.served.name == "fast"
    fast = trainer.candidates.candidates["fast"].model.get_weights()
    configured = trainer.model.get_weights()
    snapshot = trainer.snapshots.take(force=True)
    assert snapshot is not None
    for served, expected in zip(snapshot.weights, fast, strict=True):
        np.testing.assert_array_equal(served, expected)
    # the scaling statistics are alike; the kernels are not
    assert not all(np.array_equal(a, b) for a, b in zip(snapshot.weights, configured, strict=True))
    writer = trainer.checkpointing.writer
    assert writer is not None
    writer.start()
    trainer.checkpointing.save_if_due(final=True)
    writer.stop()
    restored = store.load_latest()
    assert restored is not None and restored.version == trainer.version
    for saved, expected in zip(restored.weights, configured, strict=True):
        np.testing.assert_array_equal(saved, expected)


def test_a_restart_serves_the_configured_candidate_restored_and_the_others_afresh(
    tmp_path,
) -> None:
    from livefit.server.storage.checkpoint import CheckpointStore

    settings = linear_settings()
    first = Trainer("m", settings, SampleQueue(10), SnapshotSlot(), Metrics(), "/CPU:0",
                    CheckpointStore(tmp_path, "m"))  # fmt: skip
    first.warm_up()
    for batch in linear_batches(10):
        first.train_batch(batch)
    assert first.candidates is not None and first.candidates.served.name == "fast"
    first.start()
    first.stop()  # a final checkpoint
    slot = SnapshotSlot()
    again = Trainer("m", settings, SampleQueue(10), slot, Metrics(), "/CPU:0",
                    CheckpointStore(tmp_path, "m"))  # fmt: skip
    again.warm_up()
    assert again.candidates is not None and again.candidates.served.name == "configured"
    assert again.version == first.version and again.samples_seen == first.samples_seen
    for restored, saved in zip(again.model.get_weights(), first.model.get_weights(), strict=True):
        np.testing.assert_array_equal(restored, saved)
    assert slot.latest is not None  # serving gets the configured candidate's weights
    for served, saved in zip(slot.latest.weights, first.model.get_weights(), strict=True):
        np.testing.assert_array_equal(served, saved)
    fresh = again.candidates.candidates["fast"]
    assert fresh.loss.total_count == 0 and again.candidates.samples == 0
