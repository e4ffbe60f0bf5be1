"""MQTT topic-filter matching (server/config/topic_filters.py): the examples of the MQTT 3.1.1 and 5
specifications (section 4.7), and properties checked against an independent regex translation
on generated filters and topics."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from livefit.server.config.topic_filters import filter_problem, topic_matches, topic_problem

SPEC_EXAMPLES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("sport/tennis", "sport/tennis", True),
    ("sport/tennis", "sport/Tennis", False),
    ("sport/tennis", "sport/tennis/", False),
    ("#", "$SYS/broker/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a/$b/#", "a/$b/c", True),  # only a topic's first character is special
    ("livefit/loop/#", "livefit/loop/weights", True),
    ("livefit/+/samples", "livefit/loop/weights", False),
]


@pytest.mark.parametrize(("topic_filter", "topic", "matches"), SPEC_EXAMPLES)
def test_specification_examples(topic_filter: str, topic: str, matches: bool) -> None:
    assert filter_problem(topic_filter) is None
    assert topic_matches(topic_filter, topic) is matches


@pytest.mark.parametrize(
    "topic_filter", ["", "sport/tennis#", "sport/tennis/#/ranking", "sport+", "a/+b/c", "##", "a\0"]
)
def test_malformed_filters_are_named(topic_filter: str) -> None:
    assert filter_problem(topic_filter) is not None


def oracle(topic_filter: str, topic: str) -> bool:
    """The same rules as a regular expression: an independent translation."""
    if topic.startswith("$") and topic_filter[:1] in "+#":
        return False
    pattern = ""
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        separator = "/" if index else ""
        if level == "#":
            pattern = f"{pattern}(?:{separator}.*)?" if index else ".*"
        else:
            pattern += separator + ("[^/]*" if level == "+" else re.escape(level))
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


topic_levels = st.lists(st.sampled_from(["a", "b", "", "$x", "ab"]), min_size=1, max_size=5)
topics = topic_levels.map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), min_size=0, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "#"  # an empty filter is malformed


@given(filters(), topics)
def test_matching_agrees_with_the_regex_translation(topic_filter: str, topic: str) -> None:
    assert filter_problem(topic_filter) is None
    assert topic_matches(topic_filter, topic) is oracle(topic_filter, topic)


@given(topics, topics)
def test_a_topic_without_wildcards_matches_only_itself(first: str, second: str) -> None:
    assert topic_matches(first, first)
    assert topic_matches(first, second) is (first == second)


@given(topic_levels, st.data())
def test_wildcards_in_place_of_levels_match(levels: list[str], data: st.DataObject) -> None:
    """``+`` for any levels and ``#`` for any tail (the parent level included) still match,
    except a leading wildcard against a ``$`` topic."""
    topic = "/".join(levels)
    plus = [data.draw(st.booleans()) for _ in levels]
    cut = data.draw(st.integers(0, len(levels)))
    kept = ["+" if p else level for p, level in zip(plus, levels, strict=True)][:cut]
    for topic_filter in ("/".join([*kept, "#"]), "/".join(kept + levels[cut:])):
        if topic == "" or filter_problem(topic_filter) is not None:
            continue
        leading_wildcard = topic_filter[0] in "+#"
        assert topic_matches(topic_filter, topic) is not (leading_wildcard and topic[0] == "$")


def refused_by_brokers(character: str) -> bool:
    """Control characters (Unicode category Cc: C0, DEL, C1) and non-characters: an
    independent statement of what mosquitto refuses (checked against it in
    ``tests/e2e/test_config_at_start.py``)."""
    code = ord(character)
    return (
        unicodedata.category(character) == "Cc"
        or 0xFDD0 <= code <= 0xFDEF
        or (code & 0xFFFE == 0xFFFE)
    )


@given(st.characters(exclude_categories=["Cs"]), st.text(alphabet="ab/", max_size=5))
def test_a_character_is_refused_exactly_when_brokers_refuse_it(character: str, around: str) -> None:
    for text in (f"{around}{character}", f"{character}{around}"):
        refused = refused_by_brokers(character)
        for problem in (topic_problem(text), filter_problem(text)):
            assert (problem is not None and "MQTT brokers refuse it" in problem) is refused, text
