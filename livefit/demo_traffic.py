"""The demo's traffic: a publisher thread (``PublisherThread``) streaming a learnable noisy
linear function of ``INPUT_DIM`` inputs to the model's topic, and a few asyncio clients
(``PredictionLoad``) sending TF Serving predict requests in a loop, counting latencies, errors
and the versions that answered.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

INPUT_DIM = 8


class PublisherThread(threading.Thread):
    """Streams the synthetic function to the model's topic, ``args.rate`` samples/s in messages
    of ``args.batch``, for ``args.duration`` seconds or until ``done``; ``error`` says why it
    stopped early, if it did."""

    def __init__(
        self, broker: str, protocol: str, model: str, args: argparse.Namespace,
        done: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(name="demo-publisher", daemon=True)
        self.broker, self.model, self.args, self.done = broker, model, args, done
        self.protocol: Any = protocol
        self.error: str | None = None
        # The loss of a model that always predicts the targets' mean (their variance, over the
        # first chunk): what "learned" is judged against when the loss fell before the first poll.
        self.constant_loss: float | None = None

    def run(self) -> None:
        from livefit.clients.publish_results import PublishError
        from livefit.clients.publisher import SamplePublisher
        from livefit.clients.synthetic import stream_chunks, stream_for_shape

        args = self.args
        count = int(args.rate * args.duration) if args.rate > 0 else 10_000_000
        chunk = args.batch * max(1, 4096 // args.batch)
        chunks = stream_chunks(stream_for_shape((INPUT_DIM,), 1, 0.01, 0), count, chunk)
        first = next(chunks, None)
        if first is not None:
            self.constant_loss = float(np.var(first[1]))
            chunks = itertools.chain([first], chunks)
        publisher = SamplePublisher(
            self.broker, f"livefit/{self.model}/samples", source=f"{self.model}-publisher",
            ack_timeout_s=5.0, protocol=self.protocol,
        )  # fmt: skip
        try:
            publisher.connect()
            publisher.publish_stream(chunks, batch=args.batch, rate=args.rate, stop=self.done)
        except (PublishError, ConnectionError) as exc:
            self.error = str(exc)
        finally:
            publisher.close()


@dataclass
class PredictionLoad:
    """``clients`` asyncio clients sending TF-Serving predict requests in a loop, on a thread of
    their own between ``start`` and ``stop``; what they saw is in ``latencies`` (seconds, of
    the answered requests), ``errors`` and ``versions``."""

    url: str
    model: str
    clients: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    versions: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the clients' thread."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True,
                                        name="demo-predictor")  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        """Stop the clients and wait (5 s at most) for their thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def _main(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        rng = np.random.default_rng(index)
        while not self._stop.is_set():
            body = {"instances": rng.normal(size=(1, INPUT_DIM)).round(4).tolist()}
            started = time.perf_counter()
            try:
                response = await client.post(f"/v1/models/{self.model}:predict", json=body)
            except httpx.HTTPError:
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            if response.status_code == 200:
                self.latencies.append(time.perf_counter() - started)
                self.versions.add(int(response.json()["model_version"]))
            else:
                self.errors += 1
                await asyncio.sleep(0.05)
