"""Stream a dataset the way delayed labels arrive: predictions with ids now, labels later.

``DelayedLabelStream`` sends each message's rows to a server's prediction API with one id per
row, and publishes each row's label on ``livefit/<model>/labels`` once ``delay`` more rows have
been predicted (its own delay per row: a fixed count, or random ones). That is the order of
river's ``evaluate.progressive_val_score(..., delay=...)``: the label of row ``i`` with delay
``d`` is learned before row ``i + d`` is predicted (as far as the learner keeps up: it learns a
label a few milliseconds after it is published, not in the same call). What the server
answered is kept (``outputs``), so the served score can be computed on the client too.

``livefit publish --label-delay N`` (``clients/publish.py``) and the delayed-labels benchmark
(``bench/delayed.py``) use it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Callable, Sequence

import numpy as np

from .pacing import Chunks, RatePacer, split_messages
from .predict import PredictClient
from .predict_calls import PredictError
from .publish_results import BrokerConnectionError, PublishError
from .publisher import SamplePublisher


class DelayedLabelStream:
    """Predicts rows with ids and releases their labels ``delay`` rows later."""

    def __init__(
        self,
        client: PredictClient,
        model: str,
        send_labels: Callable[[bytes], None],
        prefix: str,
    ) -> None:
        self.client = client
        self.model = model
        self.send_labels = send_labels
        self.prefix = prefix
        self.predicted = 0  # rows predicted so far
        self.labelled = 0  # labels published so far
        self.outputs: list[np.ndarray] = []  # what the server answered, one array per message
        self._waiting: list[tuple[int, int, np.ndarray]] = []  # (release at, row, label)

    def send(self, x: np.ndarray, y: np.ndarray, delays: Sequence[int]) -> np.ndarray:
        """Predict the rows of ``x`` (ids ``<prefix>-<row>``), schedule their labels ``y``
        ``delays`` rows later, publish the labels now due; returns the predictions."""
        first = self.predicted
        ids: list[str | int] = [f"{self.prefix}-{first + i}" for i in range(len(x))]
        result = self.client.predict(self.model, x, ids=ids)
        self.outputs.append(result.outputs)
        for i, delay in enumerate(delays):
            heapq.heappush(self._waiting, (first + i + int(delay), first + i, y[i]))
        self.predicted += len(x)
        self._release(self.predicted)
        return result.outputs

    def finish(self) -> None:
        """Publish every label still waiting (the stream has ended)."""
        self._release(None)

    def _release(self, upto: int | None) -> None:
        rows, labels = [], []
        while self._waiting and (upto is None or self._waiting[0][0] <= upto):
            _, row, label = heapq.heappop(self._waiting)
            rows.append(f"{self.prefix}-{row}")
            labels.append(np.asarray(label, dtype=np.float64).tolist())
        if rows:
            self.send_labels(json.dumps({"id": rows, "y": labels}).encode())
            self.labelled += len(rows)


def fixed_delays(delay: int) -> Callable[[int], list[int]]:
    """Every row waits ``delay`` rows."""
    return lambda n: [delay] * n


def random_delays(high: int, seed: int = 0) -> Callable[[int], list[int]]:
    """Each row waits a uniform random number of rows, 0 to ``high``."""
    rng = np.random.default_rng(seed)
    return lambda n: rng.integers(0, high + 1, size=n).tolist()


def run_delayed(args: argparse.Namespace, chunks: Chunks, publisher: SamplePublisher) -> int:
    """`livefit publish --label-delay N`: 0 when every row was predicted and every label
    acknowledged by the broker, 1 on a failure, 2 on invalid options, 130 when interrupted."""
    if args.label_delay < 0:
        print("error: --label-delay must be 0 or more", file=sys.stderr)
        return 2
    make = random_delays(args.label_delay, args.seed) if args.label_delay_random else None
    delays = make or fixed_delays(args.label_delay)
    pacer = RatePacer(args.rate) if args.rate > 0 else None
    try:
        publisher.connect()
        with PredictClient(args.server) as client:
            stream = DelayedLabelStream(
                client, args.model, publisher.publish_payload, publisher.source or "publish"
            )
            for x, y in split_messages(chunks, args.batch):
                if pacer is not None:
                    pacer.wait(stream.predicted)
                stream.send(x, y, delays(len(x)))
            stream.finish()
        if not publisher.flush():
            raise PublishError("labels not acknowledged by the broker in time")
    except (BrokerConnectionError, PublishError, PredictError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    finally:
        publisher.close()
    print(
        f"predicted {stream.predicted} samples with ids through {args.server} and published "
        f"{stream.labelled} labels to {publisher.topic} at {publisher.address}",
        flush=True,
    )
    return 0
