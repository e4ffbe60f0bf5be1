"""Learner configs for tests, as the TOML text a user writes: ``[broker]``, ``[storage]`` and
one ``[models.<name>]`` section (with its sub-tables) per model.

    text = learner_config(broker, tmp_path / "data", "my-test", model(train="max_batch_size = 64"))

Extra lines are TOML as written in the file (``"seed = 3\\nlearning_rate = 0.01"``); a test
that needs a key of its own adds it here rather than writing the whole file again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from livefit.server.runtime.mosquitto import Mosquitto
from tests.layouts import ONE_PROCESS, with_layout

# The small network the weight-stream and dashboard tests train (16 hidden units).
SMALL_MLP = "builder_options = { hidden_units = [16] }\nlearning_rate = 0.01\nseed = 11"


def model(
    name: str = "demo", builder: str = "linear", input_shape: Sequence[int] = (8,),
    output_shape: Sequence[int] = (1,), lines: str = "", **tables: str,
) -> str:  # fmt: skip
    """``[models.<name>]`` with ``lines`` added, then ``[models.<name>.<table>]`` with its
    lines for each keyword (``train=``, ``weights=``, ``checkpoint=``, ...), in that order."""
    text = (
        f'[models.{name}]\nbuilder = "{builder}"\ninput_shape = {list(input_shape)}\n'
        f"output_shape = {list(output_shape)}\n{_lines(lines)}"
    )
    return text + "".join(
        f"[models.{name}.{table}]\n{_lines(body)}" for table, body in tables.items()
    )


def learner_config(
    broker: Mosquitto | str, storage: Path | str, client_id: str, *models: str,
    broker_lines: str = "", storage_lines: str = "", layout: str = ONE_PROCESS,
) -> str:  # fmt: skip
    """A whole config: ``broker`` (a test broker or a URL) with ``broker_lines``, ``storage``
    with ``storage_lines``, ``models`` (``model()`` texts; one default model when none), and
    the learner's ``layout`` written out (``tests/layouts.py``: one process unless told)."""
    url = broker if isinstance(broker, str) else broker.url
    text = (
        f'[broker]\nurl = "{url}"\nclient_id = "{client_id}"\n{_lines(broker_lines)}'
        f'[storage]\ndir = "{storage}"\n{_lines(storage_lines)}' + "".join(models or (model(),))
    )
    return with_layout(text, layout)


def _lines(text: str) -> str:
    """``text`` ending in exactly one newline ("" for none)."""
    text = text.strip("\n")
    return f"{text}\n" if text else ""
