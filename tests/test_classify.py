"""Classification: key → tenant, requested class clamped to the tenant's maximum."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import pytest

from llmvalve.core.classify import (
    AuthFailure,
    Classified,
    Classifier,
    Unauthorized,
    bearer_token,
)
from llmvalve.core.policy import SEED_QUEUES, Policy, TenantSpec, hash_api_key
from llmvalve.gateway.policy_file import load_policy_file

GOLD, AGENT, BATCH = "sk-gold-123", "sk-agent-456", "sk-batch-789"

TENANTS = (
    TenantSpec("gold", (hash_api_key(GOLD),), max_priority=0, default_priority=0),
    TenantSpec("agents", (hash_api_key(AGENT), hash_api_key("sk-agent-old")), 1, 2),
    TenantSpec("batch", (hash_api_key(BATCH),), 2, 2),
)


def classifier(anonymous: TenantSpec | None = None) -> Classifier:
    return Classifier(Policy(queues=SEED_QUEUES, tenants=TENANTS, anonymous=anonymous))


def bearer(key: str) -> str:
    return f"Bearer {key}"


@pytest.mark.parametrize(("key", "requested", "expected"), [
    # no request → the tenant's default
    (GOLD, None, Classified("gold", 0)),
    (AGENT, None, Classified("agents", 2)),
    (BATCH, None, Classified("batch", 2)),
    # lowering one's own class is always allowed
    (GOLD, "2", Classified("gold", 2)),
    (GOLD, "P1", Classified("gold", 1)),
    (AGENT, "p1", Classified("agents", 1)),
    (AGENT, "batch-extraction", Classified("agents", 2)),
    # raising above the tenant's maximum is clamped to it
    (BATCH, "0", Classified("batch", 2, clamped=True)),
    (BATCH, "realtime-interactive", Classified("batch", 2, clamped=True)),
    (AGENT, "P0", Classified("agents", 1, clamped=True)),
    (AGENT, " Realtime-Interactive ", Classified("agents", 1, clamped=True)),
    # unknown values are ignored: the default applies, nothing was clamped
    (AGENT, "urgent", Classified("agents", 2)),
    (AGENT, "7", Classified("agents", 2)),
    (AGENT, "-1", Classified("agents", 2)),
    (AGENT, "", Classified("agents", 2)),
    (GOLD, "P", Classified("gold", 0)),
    # every key of a tenant works
    ("sk-agent-old", "1", Classified("agents", 1)),
])
def test_clamping(key, requested, expected):
    assert classifier().classify(bearer(key), requested) == expected


@pytest.mark.parametrize("authorization", [
    "bearer sk-gold-123", "BEARER sk-gold-123", "  Bearer   sk-gold-123  ",
])
def test_bearer_scheme_is_case_insensitive_and_trimmed(authorization):
    assert classifier().classify(authorization, None) == Classified("gold", 0)


@pytest.mark.parametrize(("authorization", "reason"), [
    (None, AuthFailure.MISSING_KEY),
    ("", AuthFailure.MISSING_KEY),
    ("Bearer", AuthFailure.MISSING_KEY),
    ("Bearer   ", AuthFailure.MISSING_KEY),
    ("Basic dXNlcjpwYXNz", AuthFailure.MISSING_KEY),
    ("sk-gold-123", AuthFailure.MISSING_KEY),  # no scheme: not a bearer token
    ("Bearer sk-unknown", AuthFailure.UNKNOWN_KEY),
    ("Bearer sk-gold-1234", AuthFailure.UNKNOWN_KEY),
    ("Bearer " + hash_api_key(GOLD), AuthFailure.UNKNOWN_KEY),  # the hash is not the key
])
def test_unauthorized_without_anonymous(authorization, reason):
    result = classifier().classify(authorization, "0")
    assert result == Unauthorized(reason)
    assert result.message


def test_anonymous_tenant_takes_missing_and_unknown_keys_and_is_clamped():
    c = classifier(TenantSpec("anonymous", (), max_priority=1, default_priority=2))
    assert c.classify(None, None) == Classified("anonymous", 2)
    assert c.classify("Bearer sk-nope", "0") == Classified("anonymous", 1, clamped=True)
    assert c.classify("Bearer sk-nope", "batch-extraction") == Classified("anonymous", 2)
    # a known key still wins over anonymous
    assert c.classify(bearer(GOLD), None) == Classified("gold", 0)


def test_priority_of():
    c = classifier()
    assert [c.priority_of(v) for v in ("0", "P1", "p2", "agent-workflow", "x", None, "3")] == [
        0, 1, 2, 1, None, None, None]


def test_bearer_token():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("Token abc") is None
    assert bearer_token(None) is None


def test_the_key_is_not_kept_anywhere():
    c = classifier()
    result = c.classify(bearer(GOLD), "1")
    assert GOLD not in repr(c) and GOLD not in repr(result)
    assert not hasattr(c, "__dict__")
    for slot in Classifier.__slots__:
        assert GOLD not in repr(getattr(c, slot))
    assert GOLD not in repr(dataclasses.asdict(result))


def test_results_are_frozen():
    result = classifier().classify(bearer(GOLD), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.priority = 2  # type: ignore[misc]


def test_default_policy_demo_keys():
    path = Path(str(resources.files("llmvalve") / "data" / "default-policy.yaml"))
    c = Classifier(load_policy_file(path))
    assert c.classify("Bearer sk-llmvalve-demo-p0", None) == Classified("interactive-app", 0)
    assert c.classify("Bearer sk-llmvalve-demo-p2", "P0") == Classified("batch-jobs", 2, True)
    assert c.classify("Bearer sk-llmvalve-demo-p2", "2") == Classified("batch-jobs", 2)
    assert c.classify(None, None) == Unauthorized(AuthFailure.MISSING_KEY)
    assert c.classify("Bearer sk-wrong", None) == Unauthorized(AuthFailure.UNKNOWN_KEY)
