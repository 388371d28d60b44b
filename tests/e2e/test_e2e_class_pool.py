"""A pool for some classes through real Envoy and the OpenAI SDK: P0's requests go to the
engine of its own pool (`pools[].priorities`), a batch tenant's to the shared engines, for the
same model, and /v1/models lists that model once."""

from __future__ import annotations

import pytest
from e2e_support import HERE, P0_KEY, P2_KEY, client, received

pytestmark = pytest.mark.e2e
POLICY = HERE / "policy-class-pool.yaml"
BACKENDS = 2


def test_each_class_is_served_by_its_pool(e2e):
    before = {pool: received(e2e, pool) for pool in ("shared", "p0")}
    for key in (P0_KEY, P2_KEY, P0_KEY, P2_KEY, P2_KEY):
        answer = client(e2e, key).chat.completions.create(
            model="sim-small", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content
    assert received(e2e, "p0") == before["p0"] + 2
    assert received(e2e, "shared") == before["shared"] + 3
    models = [m.id for m in client(e2e, P0_KEY).models.list()]
    assert len(models) == len(set(models)), models
    e2e.wait_idle()
