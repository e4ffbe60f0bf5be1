"""MQTT topic filters (MQTT 3.1.1 section 4.7, MQTT 5 section 4.7): which topics a filter
matches, and which filters are well formed. Pure functions, no broker and no paho.

The rules: levels are separated by ``/`` (an empty level is a level); ``+`` matches exactly one
level, and must be a whole level; ``#`` matches the parent level and any number of levels below
it, and must be the last level, alone; a filter that starts with a wildcard does not match a
topic that starts with ``$`` (``$SYS/...``), while ``$SYS/#`` does.

``config`` uses ``topic_matches`` to refuse a data subscription that would consume a topic
livefit itself publishes (a learner reading its own weights and dead-letter reports).
"""

from __future__ import annotations


def filter_problem(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT topic filter, or None when it is."""
    if not topic_filter:
        return "an empty topic filter"
    if "\0" in topic_filter:
        return "a NUL character"
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return "'#' must be a whole level and the last one"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
    return None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True when a subscription to ``topic_filter`` receives messages published on ``topic``.

    ``topic_filter`` must be valid (``filter_problem`` is None); ``topic`` is a topic name
    (no wildcards)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    wanted, levels = topic_filter.split("/"), topic.split("/")
    for index, part in enumerate(wanted):
        if part == "#":
            return True  # this level and everything below it, the parent level included
        if index >= len(levels):
            return False
        if part != "+" and part != levels[index]:
            return False
    return len(wanted) == len(levels)
