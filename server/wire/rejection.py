"""What every message decoder raises (``Rejection``), with a reason from a bounded set
(``REASONS``, a metric label) and a detail for the dead-letter report."""

from __future__ import annotations

REASONS = (
    "too_large",  # payload over max_message_bytes
    "undecodable",  # neither valid JSON nor msgpack
    "bad_schema",  # not a map, x or y missing, wrong types for the optional fields
    "bad_shape",  # wrong rank or dimensions, ragged arrays, empty batch
    "non_numeric",  # strings, booleans, objects where numbers belong
    "non_finite",  # NaN or infinity in x or y
    "length_mismatch",  # x, y and w disagree on the number of samples
    "bad_weight",  # negative, non-finite or misshapen sample weights
    "too_many_samples",  # more samples in one message than max_samples_per_message
    "internal",  # an unforeseen exception in the decoder (a bug); the detail names it
)


class Rejection(Exception):
    """A message that cannot be trained on: ``reason`` is one of REASONS, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def short(exc: BaseException | str, limit: int = 200) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."
