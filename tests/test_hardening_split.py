"""``test_hardening.py``'s poison messages and full disk against the split learner
(``http.workers = 1``, ``livefit serve``'s default on 2 cores): 2,000 hostile messages ingested
by the training process are rejected, acknowledged and dead-lettered each with its reason, 100
valid samples after them are trained, the serving process answers ready, and no process logs a
traceback; 15,000 samples into a full disk, room again, SIGKILL of the parent and a restart:
all 15,000 in the lineage. (The restart that shows nothing is
redelivered runs with the one-process learner only: acknowledging is the ingestion's code, the
same in the training process.) Why the other hardening tests are not run split:
``test_hardening.py``'s docstring.
"""

from __future__ import annotations

import pytest

from tests.layouts import SPLIT
from tests.test_hardening import (  # noqa: F401  (collected here, with this file's layout)
    small_disk,
    test_full_disk_loses_no_acknowledged_sample,
    test_poison_messages_end_acknowledged_and_training_goes_on,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def layout() -> str:
    return SPLIT
