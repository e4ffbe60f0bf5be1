"""MQTT topic filters (MQTT 3.1.1 section 4.7, MQTT 5 section 4.7): which topics a filter
matches, and which filters are well formed. Pure functions, no broker and no paho.

The rules: levels are separated by ``/`` (an empty level is a level); ``+`` matches exactly one
level, and must be a whole level; ``#`` matches the parent level and any number of levels below
it, and must be the last level, alone; a filter that starts with a wildcard does not match a
topic that starts with ``$`` (``$SYS/...``), while ``$SYS/#`` does.

A topic name (what a message is published on) has no wildcards. Both are UTF-8 strings of at
most 65,535 bytes (a 2-byte length in the packet), without U+0000 or surrogates (MQTT 5
section 1.5.4: "MUST NOT"). The same section says they SHOULD NOT hold control characters
(U+0001-U+001F, U+007F-U+009F) or Unicode non-characters (U+FDD0-U+FDEF, and the last two code
points of every plane); mosquitto closes the connection of a client that sends one in a
PUBLISH or SUBSCRIBE, so livefit refuses them too.

``config`` uses ``topic_matches`` to refuse a data subscription that would consume a topic
livefit itself publishes (a learner reading its own weights and dead-letter reports), and
``topic_problem`` to refuse a topic livefit publishes on that no broker would take.
"""

from __future__ import annotations

import re

MAX_TOPIC_BYTES = 65_535
# The rules above as the settings' descriptions state them (docs/configuration.md).
REFUSED_TOPIC_CHARACTERS = (
    "U+0000, a control character (U+0001-U+001F, U+007F-U+009F) or a Unicode non-character "
    "(U+FDD0-U+FDEF, U+FFFE, U+FFFF, ...: mosquitto disconnects a client that sends one)"
)
PUBLISHED_TOPIC_RULES = (
    ". A topic livefit publishes on is a topic name: `+` or `#` in it, over MQTT's 65,535 "
    f"UTF-8 bytes, or {REFUSED_TOPIC_CHARACTERS} is refused at load, naming the key"
)
_PLANE_ENDS = "".join(chr(plane << 16 | low) for plane in range(17) for low in (0xFFFE, 0xFFFF))
# What a broker refuses in a topic (the module docstring): C0, DEL and C1, and non-characters.
_REFUSED = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\ufdd0-\\ufdef{_PLANE_ENDS}]")


def _string_problem(value: str, what: str) -> str | None:
    if not value:
        return f"an empty {what}"
    refused = _REFUSED.search(value)
    if refused is not None:
        return _character_problem(refused.group(), refused.start())
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8 (a lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return f"{size} UTF-8 bytes, over MQTT's {MAX_TOPIC_BYTES}"
    return None


def _character_problem(character: str, index: int) -> str:
    code = ord(character)
    if code == 0:
        what = "a NUL character (U+0000)"
    elif code <= 0x9F:
        what = f"a control character (U+{code:04X})"
    else:
        what = f"a Unicode non-character (U+{code:04X})"
    return f"{what} at character {index + 1}: MQTT brokers refuse it (mosquitto disconnects)"


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` is not an MQTT topic name (one to publish on), or None when it is."""
    problem = _string_problem(topic, "topic")
    if problem is None and ("+" in topic or "#" in topic):
        problem = "wildcards ('+', '#') belong in subscriptions, a message is published on a name"
    return problem


def checked_topic(topic: str | None) -> str | None:
    """``topic`` (None: the default) for a settings validator: ValueError when livefit could
    not publish on it (``topic_problem``), at load rather than at every publish."""
    problem = topic_problem(topic) if topic is not None else None
    if problem is not None:
        raise ValueError(f"{shown_topic(topic)} is not an MQTT topic to publish on: {problem}")
    return topic


def shown_topic(value: str | None) -> str:
    """``repr(value)``, shortened when long (a 65,535-byte topic in an error line)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(value or '')} characters)"


def filter_problem(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT topic filter, or None when it is."""
    problem = _string_problem(topic_filter, "topic filter")
    if problem is not None:
        return problem
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
