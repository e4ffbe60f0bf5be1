"""The one writer of livefit config files for the bench: every fleet's learner reads one.

A model is a plain ``[models.<name>]`` table (a dict, as a user writes it in TOML); the writer
adds the broker and storage the bench gives. ``builder_options`` is written inline, any other
dict as a sub-table (``[models.<name>.train]``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

INLINE = frozenset({"builder_options"})  # dict keys written as inline tables


# The learner layout of a fleet's ``livefit serve``: one process (``http.workers = 0``), as every
# "serve" figure in BENCHMARKS.md was measured. The default (unset) splits the learner, one
# serving process on 2 cores; the benchmarks that depend on the layout (workers, interference,
# memory, freshness) run both side by side through ``relocated``.
FLEET_WORKERS = 0


def learner_config(
    broker_url: str, storage: str, client_id: str, models: Mapping[str, Mapping[str, Any]]
) -> str:
    """A livefit config at default settings but for the broker, storage and ``models`` given
    (model name -> its table) and the layout (``http.workers = FLEET_WORKERS``)."""
    tables = [toml_table(f"models.{name}", table) for name, table in models.items()]
    return (
        f'[broker]\nurl = "{broker_url}"\nclient_id = "{client_id}"\n\n'
        f"[http]\nworkers = {FLEET_WORKERS}\n\n"
        f'[storage]\ndir = "{storage}"\n\n' + "\n".join(tables)
    )


def toml_table(name: str, table: Mapping[str, Any]) -> str:
    """``[name]`` with scalar keys and inline tables, then its sub-tables."""
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping) or k in INLINE}
    lines = [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in plain.items())]
    text = "\n".join(lines) + "\n"
    for key, sub in table.items():
        if key not in plain:
            text += toml_table(f"{name}.{key}", sub)
    return text


def toml_value(value: Any) -> str:
    """One TOML value: a bool, a string, a number, a list or an inline table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def relocated(text: str, broker_url: str, storage: str, workers: int) -> str:
    """``text`` (a config this module wrote) for another broker and storage directory, with
    ``http.workers`` set and a client id of its own: the same models as another learner, run
    beside it without sharing anything."""
    text = re.sub(r'(?m)^url = ".*"$', f'url = "{broker_url}"', text, count=1)
    text = re.sub(r'(?m)^dir = ".*"$', f'dir = "{storage}"', text, count=1)
    text = re.sub(r'(?m)^client_id = "(.*)"$', rf'client_id = "\1-w{workers}"', text, count=1)
    return re.sub(r"(?m)^workers = \d+$", f"workers = {workers}", text, count=1)
