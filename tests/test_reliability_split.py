"""``test_reliability.py``'s tests against the split learner (``http.workers = 1``): SIGKILL of
the whole learner (4 times), two broker restarts, a corrupt newest checkpoint, backpressure,
SIGSTOP of the training process then of the broker. Nothing a publisher had acknowledged may
be lost, and versions never go backwards.
"""

from __future__ import annotations

import pytest

from tests.layouts import SPLIT
from tests.test_reliability import (  # noqa: F401  (collected here, with this file's layout)
    test_backpressure_slows_ingestion_and_drops_nothing,
    test_broker_restarted_twice_loses_nothing,
    test_corrupt_newest_checkpoint_falls_back,
    test_repeated_sigkills_lose_nothing,
    test_sigstop_of_learner_then_broker_loses_nothing,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def layout() -> str:
    return SPLIT
