"""``test_weight_stream.py``'s large-model test against the split learner (``http.workers =
1``): the replica pulls what the training process's manifest names from the learner's port,
where a serving process answers with the snapshot it got over the local feed; the bytes, their
sha256 and the lineage must be the manifest's. Why the other weight-stream tests are not run
split: ``test_weight_stream.py``'s docstring.
"""

from __future__ import annotations

import pytest

from tests.layouts import SPLIT
from tests.test_weight_stream import (  # noqa: F401  (collected here, with this file's layout)
    test_large_model_goes_through_manifest_and_http_pull,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def layout() -> str:
    return SPLIT
