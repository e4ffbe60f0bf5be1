"""``test_labels_e2e.py``'s join test against the split learner (``http.workers = 1``): the
learner's predictions with ids are recorded by its serving process, labels come over MQTT and
over HTTP (forwarded by the serving process and by a replica), and the training process joins
them in both orders, each once, and learns from them. Why the other label tests are not run
split: ``test_labels_e2e.py``'s docstring.
"""

from __future__ import annotations

import pytest

from tests.layouts import SPLIT
from tests.test_labels_e2e import (  # noqa: F401  (collected here, with this file's layout)
    fleet,
    test_learner_and_replica_predictions_join_in_both_orders,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def layout() -> str:
    return SPLIT
