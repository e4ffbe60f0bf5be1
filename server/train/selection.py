"""Online model selection: several candidates of one model learn the same minibatches; the one
with the lowest recent prequential loss is served.

``CandidateSet`` owns the candidates' compiled models, their training steps, update policies and
windowed losses; the trainer calls ``learn`` once per batch instead of its own policy, takes the
served candidate's weights for each snapshot (``served_model``) and the configured candidate's
for checkpoints. ``SwitchRule`` decides, with hysteresis, when the served candidate changes
(River's ``model_selection.GreedyRegressor`` re-picks the best at every sample; a margin and a
spacing between switches keep near ties from flapping).

Candidates share the configured network's architecture (settings refuse another builder), so a
snapshot of any of them fits the network every replica builds from the config.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import keras
import numpy as np

from ..config.model import ModelSettings
from ..config.model_tables import CONFIGURED_CANDIDATE, SelectionSettings
from ..wire.samples import Batch
from .modeling import build_compiled, experts_rule, make_loss
from .placement import Placement
from .prequential import WindowedMean
from .train_step import TrainStep
from .update_policy import Learned, UpdatePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Switch:
    """The served candidate changed from ``old`` to ``new`` after ``samples`` samples."""

    old: str
    new: str
    scores: dict[str, float]  # each candidate's windowed prequential loss at the switch
    samples: int


class SwitchRule:
    """When to serve another candidate: its windowed loss is below ``1 - margin`` times the
    served one's (or the served one's is not finite), and ``min_samples_between`` samples
    have been learned since the last switch (or the start)."""

    def __init__(self, margin: float, min_samples_between: int) -> None:
        self.margin = margin
        self.min_samples_between = min_samples_between

    def choose(self, served: str, scores: dict[str, float], samples_since: int) -> str | None:
        """The candidate to serve instead of ``served``, or None to keep it. ``scores``:
        each eligible candidate's windowed loss (NaN: not scored yet)."""
        if samples_since < self.min_samples_between:
            return None
        finite = {name: s for name, s in scores.items() if name != served and math.isfinite(s)}
        if not finite:
            return None
        best = min(finite, key=finite.__getitem__)
        current = scores.get(served, math.nan)
        if not math.isfinite(current) or finite[best] < (1.0 - self.margin) * current:
            return best
        return None


class Candidate:
    """One candidate: its compiled model, training step, update policy and windowed loss."""

    def __init__(self, name: str, policy: UpdatePolicy, window: int) -> None:
        self.name = name
        self.policy = policy
        self.loss = WindowedMean(window)
        self.failed_at: int | None = None  # samples seen when a batch last failed or scored NaN

    @property
    def model(self) -> keras.Model:
        return self.policy.step.model

    def score(self, window: int, samples: int) -> float:
        """The windowed prequential loss; NaN while a failure lies within the window."""
        if self.failed_at is not None and samples - self.failed_at < window:
            return math.nan
        return self.loss.value


class CandidateSet:
    """The candidates of model ``name``: ``configured`` (the trainer's own policy, given) and
    one per ``settings.selection.candidates``, built on ``placement``."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        configured: UpdatePolicy,
        placement: Placement,
    ) -> None:
        self.name = name
        selection: SelectionSettings = settings.selection
        self.window = selection.window
        self.rule = SwitchRule(selection.margin, selection.min_samples_between_switches)
        self.candidates = {CONFIGURED_CANDIDATE: Candidate(CONFIGURED_CANDIDATE, configured,
                                                           self.window)}  # fmt: skip
        for entry in selection.candidates:
            own = settings.candidate_settings(entry.name)
            model = build_compiled(own, placement)
            step = TrainStep(
                model,
                make_loss(own),
                own.input_shape,
                own.resolved_target_shape(),
                placement,
                weight_average=own.train.weight_average,
                experts=experts_rule(own),
            )
            policy = UpdatePolicy(own, step, None, seed=own.seed)
            self.candidates[entry.name] = Candidate(entry.name, policy, self.window)
        self.served = self.candidates[CONFIGURED_CANDIDATE]
        self.samples = 0
        self.samples_at_switch = 0
        self.switches = 0

    @property
    def served_model(self) -> keras.Model:
        """The model whose weights snapshots carry."""
        return self.served.model

    @property
    def configured(self) -> Candidate:
        return self.candidates[CONFIGURED_CANDIDATE]

    def warm_up(self) -> None:
        """Trace every candidate's step but the configured one's (the trainer traces that)."""
        for candidate in self.candidates.values():
            if candidate.name != CONFIGURED_CANDIDATE:
                candidate.policy.step.warm_up()

    def scores(self) -> dict[str, float]:
        """Each candidate's windowed prequential loss (NaN: none yet, or a recent failure)."""
        return {n: c.score(self.window, self.samples) for n, c in self.candidates.items()}

    def learn(self, batch: Batch, extras_allowed: bool = True) -> Learned:
        """Every candidate scores and learns ``batch``; returns what the served candidate did
        (its predictions are those served before the batch). A candidate other than the served
        one that fails is logged and kept out of selection for a window; the served one's
        failure is raised, as the trainer's own step's would be."""
        served = self.served
        result = served.policy.learn(batch, extras_allowed)
        self._scored(served, result)
        for candidate in self.candidates.values():
            if candidate is served:
                continue
            try:
                self._scored(candidate, candidate.policy.learn(batch, extras_allowed))
            except Exception:
                candidate.failed_at = self.samples
                log.exception("%s: candidate %s failed a batch of %d; kept out of selection "
                              "for %d samples", self.name, candidate.name, len(batch),
                              self.window)  # fmt: skip
        self.samples += len(batch)
        return result

    def _scored(self, candidate: Candidate, learned: Learned) -> None:
        losses = learned.first.prequential_losses
        if not learned.first.applied or not np.all(np.isfinite(losses)):
            candidate.failed_at = self.samples
            return
        candidate.loss.add(losses)

    def reconsider(self) -> Switch | None:
        """Serve the candidate ``SwitchRule`` chooses, if any; returns the switch made."""
        scores = self.scores()
        chosen = self.rule.choose(self.served.name, scores, self.samples - self.samples_at_switch)
        if chosen is None:
            return None
        switch = Switch(old=self.served.name, new=chosen, scores=scores, samples=self.samples)
        self.served = self.candidates[chosen]
        self.samples_at_switch = self.samples
        self.switches += 1
        return switch
