"""Verification of weight-stream messages, whatever carried them (the MQTT weight topic for
replicas and ``WeightSubscriber``, a split learner's local feed for its serving processes).

A ``WeightVerifier`` takes raw messages (``submit``, from any thread; only the newest 64 wait,
an older one dropped unread is counted ``superseded``) and a worker thread checks each in this
order, refusing it (counted by outcome via ``on_outcome``, never stopping) at the first
failure:

1. a well-formed envelope (``weights.format``): else ``unsigned`` (no envelope at all) or
   ``bad_payload``;
2. its signature with the learner's public key (``bad_signature``), and its HMAC when a
   shared key is set (``bad_hmac``); a missing one is ``unsigned``;
3. the topic and model it was signed for (``wrong_topic``, ``wrong_model``) and the
   architecture (``wrong_architecture``; a verifier made with ``fingerprint=None`` takes any,
   its receiver builds the network from the snapshot's description);
4. freshness (below): ``expired``, ``stale``, ``rollback``, or ``refreshed`` (the snapshot
   already served, re-signed by an idle learner: nothing to do);
5. the payload: inline, or pulled over HTTP from the configured learner origin only
   (``pull_url``; never a URL from a message) with a hard size limit, aborted as soon as it is
   exceeded (``too_large``, ``pull_failed``); its size and sha256 (``bad_sha256``); its
   safetensors structure and metadata (``bad_payload``, ``wrong_model``); finite values
   (``non_finite``);
6. what the receiver itself checks in ``on_weights``, which may raise ``WeightsRejected`` (a
   ``WeightSubscriber`` that cannot build the network a description names:
   ``bad_description``).

The serving record signed into the header (``serving``: labels, pin) goes to ``on_record``
once the envelope is verified, before its weights are applied (a pin is in force before the
newest version could be served unpinned), and also from a ``refreshed`` or ``stale`` envelope
of the lineage served (a move re-signs the newest snapshot; the receiver keeps only a record
with a higher sequence, so an old envelope replayed moves nothing back).

Freshness. Versions are compared only within a lineage. A snapshot of the current lineage must
have a newer version. A snapshot of another lineage (the learner restarted with new storage)
is taken, and counted ``new_lineage``, only when it was created after the newest snapshot
accepted so far: an old lineage's snapshot replayed later is a ``rollback``. Whatever the
lineage, a message signed more than ``max_age_s`` ago (receiver's clock) is ``expired``: this
bounds what a receiver with no state (just started) can be handed; the learner re-signs its
newest snapshot every ``weights.refresh_interval_s`` so an idle learner's weights stay valid.

Refusals are logged at most once per outcome every ``REFUSAL_LOG_INTERVAL_S``, saying how many
were held back (each is counted); a flood of garbage on the topic or a learner signing with a
rotated key is a line per interval, not one per message. When every message has been refused
for ``refused_unready_s`` since the last one that verified (``RefusalStreak``),
``refusal_problem`` says so for readiness, while the last good weights keep serving.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import numpy as np

from ..storage.health import LogLimiter
from .format import (
    EnvelopeHeader,
    WeightsMeta,
    WeightsRejected,
    check_arrays,
    check_body,
    check_matches,
    decode_weights,
    detached,
    open_envelope,
)
from .receiver_auth import Authenticator

log = logging.getLogger(__name__)
OUTCOMES = (
    "accepted", "new_lineage", "refreshed", "stale", "rollback", "expired", "unsigned",
    "bad_signature", "bad_hmac", "bad_sha256", "bad_payload", "wrong_topic", "wrong_model",
    "wrong_architecture", "non_finite", "too_large", "pull_failed", "superseded",
    "bad_description",
)  # fmt: skip
QUIET_OUTCOMES = ("stale", "refreshed")  # logged at DEBUG: normal on a busy stream
REFUSAL_LOG_INTERVAL_S = 10.0  # as the learner's rejected samples (ingest.worker)
DEFAULT_MAX_PULL_BYTES = 256 * 1024 * 1024
_POLL_S = 0.1
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class ReceivedWeights:
    """Verified weights, in the local model's order, with what the payload says of itself."""

    arrays: list[np.ndarray]
    meta: WeightsMeta
    payload: bytes
    received_at: float
    signed_at: float = 0.0
    new_lineage: bool = False  # this snapshot switches the receiver to another lineage
    envelope: bytes = b""  # the signed envelope without its body (``format.detached``)


class RefusalStreak:
    """How long every weight message has been refused since the last one that verified.

    A streak starts at the first refusal after a verified message (or after start) and counts
    only while refusals keep coming: it is ``unready`` once the newest refusal is
    ``unready_s`` (0: never) after the first. A verified message ends it; ``stale`` messages
    (the served snapshot delivered again on a reconnect) neither start nor extend one."""

    def __init__(self, unready_s: float) -> None:
        self.unready_s = unready_s
        self.since: float | None = None  # time.monotonic() of the streak's first refusal
        self.unready = False

    def refused(self, now: float) -> bool:
        """Note a refusal at ``now``; True when the streak has just become unready."""
        if self.since is None:
            self.since = now
        if self.unready or self.unready_s <= 0 or now - self.since < self.unready_s:
            return False
        self.unready = True
        return True

    def verified(self, now: float) -> float | None:
        """End the streak; how long it lasted when it had made readiness fail, else None."""
        lasted = now - self.since if self.unready and self.since is not None else None
        self.since, self.unready = None, False
        return lasted

    def seconds(self, now: float) -> float:
        return now - self.since if self.since is not None else 0.0


class WeightVerifier:
    """Verifies messages for one model and delivers verified, newer weights to
    ``on_weights``; ``connected`` is set by the transport feeding it."""

    def __init__(
        self,
        model: str,
        topic: str,
        fingerprint: str | None,
        on_weights: Callable[[ReceivedWeights], None],
        auth: Authenticator,
        *,
        on_outcome: Callable[[str], None] | None = None,
        pull_url: str | None = None,
        pull_timeout_s: float = 30.0,
        pull_headers: dict[str, str] | None = None,
        max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES,
        max_age_s: float = 86400.0,
        refused_unready_s: float = 0.0,
        on_record: Callable[[str], None] | None = None,
    ) -> None:
        """``on_record``: hears the serving record of verified envelopes (module docstring)."""
        self.model = model
        self.on_record = on_record
        self._verified_header: EnvelopeHeader | None = None  # the last one past the signature
        self.topic = topic
        self.fingerprint = fingerprint
        self.on_weights = on_weights
        self.auth = auth
        self.on_outcome = on_outcome
        self.pull_url = pull_url.rstrip("/") if pull_url else None
        self.pull_timeout_s = pull_timeout_s
        self.pull_headers = pull_headers or {}
        self.max_pull_bytes = max_pull_bytes
        self.max_age_s = max_age_s
        # What was accepted last: the lineage, version, creation and signing times.
        self.lineage: str | None = None
        self.version: int | None = None
        self.created_at = 0.0
        self.signed_at = 0.0
        self.connected = threading.Event()
        self.last_refused: str | None = None  # why the last weights were refused, if they were
        self.streak = RefusalStreak(refused_unready_s)
        self._log_limiter = LogLimiter(REFUSAL_LOG_INTERVAL_S)
        self._inbox: queue.Queue[bytes | None] = queue.Queue(maxsize=64)  # None: tasks wait
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()  # ``defer``
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        self._worker = threading.Thread(
            target=self._run, name=f"weights-in-{self.model}", daemon=True
        )
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.connected.clear()
        if self._worker is not None:
            self._worker.join(timeout)
            self._worker = None

    def not_connected_reason(self) -> str:
        """Why no weights can arrive now (the transport says more)."""
        return f"weights of {self.model}: not connected to their source"

    def refusal_problem(self) -> str | None:
        """A readiness line while every message has been refused for ``refused_unready_s``
        (the last good weights still serve), else None."""
        if not self.streak.unready:
            return None
        return (
            f"weights of {self.model}: refused every snapshot for "
            f"{self.streak.seconds(time.monotonic()):.0f} s (last: {self.last_refused}); "
            f"{self._serving()}"
        )

    def _serving(self) -> str:
        return f"still serving version {self.version}" if self.version is not None else "no weights"

    def submit(self, data: bytes) -> None:
        """Queue one message for verification (any thread; returns at once). Only the newest
        matter: when 64 wait, the oldest is dropped (``superseded``)."""
        try:
            self._inbox.put_nowait(data)
        except queue.Full:
            with contextlib.suppress(queue.Empty):
                self._inbox.get_nowait()
                self._count("superseded")
            with contextlib.suppress(queue.Full):
                self._inbox.put_nowait(data)

    def defer(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the worker thread, in order with the messages (any thread; returns
        at once; never dropped): a transport's work that is too slow for its own callback."""
        self._tasks.put(task)
        with contextlib.suppress(queue.Full):
            self._inbox.put_nowait(None)  # a full inbox wakes the worker anyway

    # verification ---------------------------------------------------------------------------
    def handle(self, data: bytes) -> ReceivedWeights:
        """Verify one message and return its weights; raise WeightsRejected otherwise."""
        envelope = open_envelope(data)
        self.auth.authenticate(envelope)
        header = envelope.header
        if header.topic != self.topic:
            raise WeightsRejected(
                "wrong_topic", f"signed for topic {header.topic!r}, received on {self.topic!r}"
            )
        if header.model != self.model:
            raise WeightsRejected("wrong_model", f"weights are for model {header.model!r}")
        self._verified_header = header
        if self.fingerprint is not None and header.fingerprint != self.fingerprint:
            raise WeightsRejected(
                "wrong_architecture",
                f"weights for a different architecture (fingerprint {header.fingerprint[:12]}, "
                f"this model {self.fingerprint[:12]}); check that both sides use the same config",
            )
        new_lineage = self._check_fresh(header)
        payload = envelope.body if header.kind == "weights" else self._pull(header)
        check_body(payload, header)
        names, arrays, meta = decode_weights(payload)
        check_matches(meta, header)
        check_arrays(arrays, header.fingerprint if self.fingerprint is None else self.fingerprint,
                     names, meta)  # fmt: skip
        return ReceivedWeights(
            arrays, meta, payload, time.time(), header.signed_at, new_lineage=new_lineage,
            envelope=detached(envelope),
        )  # fmt: skip

    def _check_fresh(self, header: EnvelopeHeader) -> bool:
        """Raise WeightsRejected unless ``header`` is newer than what was accepted; True when
        it starts another lineage."""
        age = time.time() - header.signed_at
        if self.max_age_s > 0 and age > self.max_age_s:
            raise WeightsRejected(
                "expired",
                f"v{header.version} was signed {age:.0f} s ago, over weights.max_age_s "
                f"({self.max_age_s:g} s); is the learner running and its clock right?",
            )
        if self.lineage is None or self.version is None:
            return False
        if header.lineage == self.lineage:
            if header.version > self.version:
                return False
            if header.version == self.version and header.signed_at > self.signed_at:
                self.signed_at = header.signed_at
                raise WeightsRejected("refreshed", f"v{header.version} re-signed by the learner")
            raise WeightsRejected(
                "stale", f"version {header.version} is not newer than {self.version}"
            )
        if header.created_at <= self.created_at:
            raise WeightsRejected(
                "rollback",
                f"lineage {header.lineage[:12]} v{header.version} was created at "
                f"{header.created_at:.3f}, before the served {self.lineage[:12]} v{self.version} "
                f"({self.created_at:.3f}): an old snapshot replayed",
            )
        return True

    def _pull(self, header: EnvelopeHeader) -> bytes:
        """Fetch a manifest's payload from the configured origin, at most its signed size."""
        if self.pull_url is None:
            raise WeightsRejected(
                "pull_failed",
                f"v{header.version} ({header.size} bytes) is announced by a manifest, and no "
                "origin is configured to pull it from: set weights.pull_url (or http.public_url) "
                "to the learner's URL",
            )
        if header.size > self.max_pull_bytes:
            raise WeightsRejected(
                "too_large",
                f"v{header.version} is {header.size} bytes, over weights.max_pull_bytes "
                f"({self.max_pull_bytes})",
            )
        url = f"{self.pull_url}/v1/models/{quote(self.model, safe='')}/weights"
        headers = {**self.pull_headers, "Accept-Encoding": "identity"}
        deadline = time.monotonic() + self.pull_timeout_s
        body = bytearray()
        try:
            with httpx.stream(
                "GET", url, params={"version": str(header.version)}, headers=headers,
                timeout=self.pull_timeout_s, follow_redirects=False,
            ) as response:  # fmt: skip
                if response.status_code in (401, 403):
                    raise WeightsRejected(
                        "pull_failed",
                        f"GET {url}: HTTP {response.status_code}: set weights.pull_token (else "
                        "http.token) to that learner's http.token",
                    )
                if response.status_code != 200:
                    raise WeightsRejected("pull_failed", f"GET {url}: HTTP {response.status_code}")
                declared = response.headers.get("content-length", "")
                # ASCII digits only ("²".isdigit() is True), and no 5,000-digit numbers.
                if re.fullmatch(r"[0-9]{1,18}", declared) and int(declared) > header.size:
                    raise WeightsRejected(
                        "too_large", f"GET {url}: {declared} bytes, the manifest says {header.size}"
                    )
                for chunk in response.iter_raw(_CHUNK):
                    body += chunk
                    if len(body) > header.size:
                        raise WeightsRejected(
                            "too_large",
                            f"GET {url}: more than the {header.size} bytes the manifest says; "
                            "aborted",
                        )
                    if time.monotonic() > deadline:
                        raise WeightsRejected(
                            "pull_failed", f"GET {url}: not done in {self.pull_timeout_s:g} s"
                        )
        except httpx.HTTPError as exc:
            raise WeightsRejected("pull_failed", f"GET {url}: {exc}") from None
        return bytes(body)

    # threads --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                data = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                data = None
            self._run_tasks()
            if data is not None:
                self._process(data)

    def _run_tasks(self) -> None:
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            try:
                task()
            except Exception:
                log.exception("weights of %s: a deferred task failed", self.model)

    def _process(self, data: bytes) -> None:
        self._verified_header = None
        try:
            received = self.handle(data)
        except WeightsRejected as exc:
            self._refused(exc.outcome, str(exc))  # "<outcome>: <detail>"
            if exc.outcome in QUIET_OUTCOMES:  # signed, of the lineage served: its record counts
                self._record_of(self._verified_header, self.lineage)
            return
        except Exception as exc:
            self._refused("bad_payload", f"bad_payload: could not be processed: {exc!r}", True)
            return
        # The record before the weights: a late replica never serves the newest unpinned
        self._record_of(self._verified_header, received.meta.lineage)
        try:
            self.on_weights(received)
        except WeightsRejected as exc:  # the receiver's own check (a subscriber's description)
            self._refused(exc.outcome, str(exc))
            return
        except Exception as exc:
            detail = f"applying v{received.meta.version} failed: {exc!r}"
            self._refused("bad_payload", f"bad_payload: {detail}", True)
            return
        self._accept(received)

    def _record_of(self, header: EnvelopeHeader | None, lineage: str | None) -> None:
        """Hand a verified envelope's serving record to ``on_record`` when it is of
        ``lineage`` (the one served, or the one being accepted); never raises."""
        if header is None or not header.serving or self.on_record is None:
            return
        if header.lineage != lineage:
            return
        try:
            self.on_record(header.serving)
        except Exception:
            log.exception("weights for %s: the serving record could not be applied", self.model)

    def _refused(self, outcome: str, text: str, traceback: bool = False) -> None:
        """Count, log (at most once per outcome per interval) and time one refusal."""
        self._count(outcome)
        if outcome in QUIET_OUTCOMES:
            log.debug("weights for %s refused (%s); keeping version %s", self.model, text,
                      self.version)  # fmt: skip
            if outcome == "refreshed":  # the learner's key signed it: the stream verifies
                self._verified()
            return
        self.last_refused = text
        held = self._log_limiter.allow(outcome)
        if held is not None:
            more = f" ({held} more refused as {outcome} since the last line)" if held else ""
            log.warning("weights for %s refused (%s); keeping version %s%s", self.model, text,
                        self.version, more, exc_info=traceback)  # fmt: skip
        if self.streak.refused(time.monotonic()):
            log.warning(
                "weights for %s: every message refused for %.0f s (last: %s); readiness fails "
                "until weights verify again (weights.refused_unready_s); %s",
                self.model, self.streak.unready_s, text, self._serving(),
            )  # fmt: skip

    def _verified(self) -> None:
        lasted = self.streak.verified(time.monotonic())
        if lasted is not None:
            log.warning("weights for %s verify again after %.0f s of refusals; ready again",
                        self.model, lasted)  # fmt: skip

    def _accept(self, received: ReceivedWeights) -> None:
        meta = received.meta
        if received.new_lineage:
            log.warning(
                "weights for %s: the learner started a new lineage %s (v%d) after %s (v%s); "
                "following it", self.model, meta.lineage, meta.version, self.lineage, self.version,
            )  # fmt: skip
        self.lineage, self.version = meta.lineage, meta.version
        self.created_at, self.signed_at = meta.created_at, received.signed_at
        self._count("new_lineage" if received.new_lineage else "accepted")
        self._verified()

    def _count(self, outcome: str) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome)
