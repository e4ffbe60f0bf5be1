"""The weight stream over HTTP, for a process that reaches the learner's URL and no broker.

A ``WeightPoller`` is a ``WeightVerifier`` (``weights.verifier``: the same checks in the same
order) fed by polling ``GET <url>/v1/models/<model>/weights`` every ``poll_interval_s`` with the
bearer token and ``If-None-Match`` (an unchanged snapshot costs a 304). The server sends the
snapshot's signed envelope without its body in ``X-Weights-Envelope``; the poller puts the
payload back behind it and submits that, so the signature, topic, freshness and sha256 are
checked exactly as for a message from the broker (a server that sends no envelope gives
``unsigned``). A snapshot the learner announced by a manifest is verified against the payload
this poll fetched, not pulled again. At most ``max_pull_bytes`` are read.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable
from urllib.parse import quote

import httpx

from .format import MAX_HEADER_BYTES, EnvelopeHeader, WeightsRejected, sha256_hex
from .receiver_auth import Authenticator
from .verifier import DEFAULT_MAX_PULL_BYTES, ReceivedWeights, WeightVerifier

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024


class WeightPoller(WeightVerifier):
    """Polls one model's weights from ``url`` and delivers verified, newer ones to
    ``on_weights``; ``connected`` is set while polls succeed."""

    def __init__(
        self,
        url: str,
        model: str,
        topic: str,
        fingerprint: str | None,
        on_weights: Callable[[ReceivedWeights], None],
        auth: Authenticator,
        *,
        on_outcome: Callable[[str], None] | None = None,
        headers: dict[str, str] | None = None,
        poll_interval_s: float = 1.0,
        timeout_s: float = 30.0,
        max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES,
        max_age_s: float = 86400.0,
    ) -> None:
        super().__init__(
            model, topic, fingerprint, on_weights, auth, on_outcome=on_outcome,
            max_pull_bytes=max_pull_bytes, max_age_s=max_age_s,
        )  # fmt: skip
        self.url = f"{url.rstrip('/')}/v1/models/{quote(model, safe='')}/weights"
        self.headers = {**(headers or {}), "Accept-Encoding": "identity"}
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.problem = "not polled yet"
        self._etag = ""
        self._fetched: tuple[str, bytes] | None = None  # (sha256, payload) of the last poll
        self._poller: threading.Thread | None = None

    def start(self) -> None:
        super().start()
        self._poller = threading.Thread(
            target=self._poll_loop, name=f"weights-poll-{self.model}", daemon=True
        )
        self._poller.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._poller is not None:
            self._poller.join(timeout)
            self._poller = None
        super().stop(timeout)

    def not_connected_reason(self) -> str:
        return f"weights of {self.model} from {self.url}: {self.problem}"

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.poll()
            except Exception:  # a poll must never end the loop
                log.exception("polling the weights of %s failed", self.model)
            self._stopping.wait(self.poll_interval_s)

    def poll(self) -> None:
        """One GET: a new snapshot is submitted for verification; failures are remembered
        (``problem``) and logged when they start."""
        try:
            with httpx.stream(
                "GET", self.url, headers={**self.headers, "If-None-Match": self._etag},
                timeout=self.timeout_s, follow_redirects=False,
            ) as response:  # fmt: skip
                if response.status_code == 304:
                    self._reachable()
                    return
                if response.status_code != 200:
                    self._unreachable(f"HTTP {response.status_code}")
                    return
                envelope = _envelope(response.headers.get("x-weights-envelope", ""))
                payload = self._read(response)
        except httpx.HTTPError as exc:
            self._unreachable(str(exc))
            return
        except WeightsRejected as exc:  # a garbled envelope header, a payload over the limit
            self._reachable()
            self._count(exc.outcome)
            self.last_refused = str(exc)
            log.warning("weights for %s refused (%s)", self.model, exc)
            return
        self._reachable()
        if envelope:  # without one (refused as unsigned) the next poll asks again
            self._etag = response.headers.get("etag", "")
        self._fetched = (sha256_hex(payload), payload)
        self.submit(envelope + payload if envelope else payload)

    def _read(self, response: httpx.Response) -> bytes:
        body = bytearray()
        for chunk in response.iter_raw(_CHUNK):
            body += chunk
            if len(body) > self.max_pull_bytes:
                raise WeightsRejected(
                    "too_large", f"more than weights.max_pull_bytes ({self.max_pull_bytes})"
                )
        return bytes(body)

    def _pull(self, header: EnvelopeHeader) -> bytes:
        """A manifest's payload is the one this poll fetched (checked against its sha256)."""
        fetched = self._fetched
        if fetched is not None and fetched[0] == header.sha256:
            return fetched[1]
        raise WeightsRejected("pull_failed", f"v{header.version}: not the payload polled")

    def _reachable(self) -> None:
        if not self.connected.is_set():
            log.info("weights of %s: polling %s", self.model, self.url)
        self.problem = ""
        self.connected.set()

    def _unreachable(self, why: str) -> None:
        if self.connected.is_set() or self.problem != why:
            log.warning("weights of %s: GET %s: %s; polling again", self.model, self.url, why)
        self.problem = why
        self.connected.clear()


def _envelope(header: str) -> bytes:
    """The detached envelope a response names ("" when none); WeightsRejected if garbled."""
    if not header:
        return b""
    if len(header) > 2 * MAX_HEADER_BYTES:
        raise WeightsRejected("bad_payload", "X-Weights-Envelope is too long")
    try:
        return base64.b64decode(header, validate=True)
    except (binascii.Error, ValueError):
        raise WeightsRejected("bad_payload", "X-Weights-Envelope is not base64") from None
