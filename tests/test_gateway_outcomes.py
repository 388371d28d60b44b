"""The one table that maps what Envoy saw to a ticket's Outcome (core/outcomes.py)."""

import pytest

from llmvalve.core.outcomes import RULES, Ending, outcome_of, parse_flags, rule_for
from llmvalve.core.types import Outcome

S, IG, D = Outcome.SUCCESS, Outcome.IGNORE, Outcome.DROPPED


@pytest.mark.parametrize(
    ("status", "flags", "cancelled", "expected"),
    [
        (200, "-", False, S),  # finished
        (204, "", False, S),
        (304, "-", False, S),
        (200, "-", True, IG),  # client left mid-stream
        (None, "-", True, IG),  # client left before the response (while at the backend)
        (200, "DC", False, IG),
        (None, "DR", False, IG),
        (400, "-", False, IG),  # the client's fault
        (404, "-", False, IG),
        (429, "-", False, D),  # the backend is overloaded
        (500, "-", False, D),
        (503, "UF", False, D),  # connect failure (Envoy's local reply)
        (503, "UH", False, D),
        (503, "UO", False, D),
        (504, "UT", False, D),
        (None, "UT", True, D),  # a timeout counts even if the client left too
        (500, "-", True, D),  # the backend failed before the client left
        (200, "UR", False, D),  # backend reset mid-stream
        (200, "UC", False, D),
        (200, "UC,DC", False, IG),  # the client left; the upstream reset followed
        (None, "-", False, IG),  # nothing seen
        # Envoy's idle timer: a long silent (non-streamed) answer cut at 504, or a stream cut
        # after its headers; neither a backend failure (it opened the breaker for every tenant,
        # found by a review) nor a whole answer's latency
        (504, "SI", False, IG),
        (200, "SI", False, IG),
    ],
)
def test_table(status, flags, cancelled, expected):
    assert outcome_of(status, flags, cancelled) is expected


def test_flags_parse():
    assert parse_flags("-") == frozenset()
    assert parse_flags("UC, DC") == {"UC", "DC"}
    assert outcome_of(200, frozenset({"UR"})) is D


def test_every_ending_has_exactly_one_first_rule():
    assert rule_for(Ending()).name == "no response seen"
    assert RULES[-1].matches(Ending(status=999))
