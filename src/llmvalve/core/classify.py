"""Who is asking, and in which class: API key → tenant, requested class → clamped priority.

Theory of operation: the `authorization: Bearer KEY` value is hashed (sha256) and the hash is
looked up among the tenants' `apiKeyHashes`; the key itself is never stored, compared or
logged, so a dict lookup on the hash leaks nothing about it. A missing or unknown key runs as
the policy's anonymous tenant when there is one, otherwise the result is `Unauthorized`.

The requested class (a header) may be written "1", "P1"/"p1" or a queue name; anything else is
ignored and the tenant's default class is used. Priority 0 is the highest class, so clamping is
a maximum of numbers:

    priority = max(requested, tenant.max_priority)     if a valid class was requested
    priority = tenant.default_priority                 otherwise

A client can lower its own class (ask for a bigger number) but never raise it above its
tenant's maximum; `clamped` says the request asked for more than it was allowed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmvalve.core.policy import Policy, TenantSpec, hash_api_key


class AuthFailure(enum.Enum):
    MISSING_KEY = "missing_key"  # no authorization header, or no Bearer token in it
    UNKNOWN_KEY = "unknown_key"  # a token that matches no tenant


@dataclass(frozen=True)
class Classified:
    tenant: str
    priority: int
    clamped: bool = False  # the client asked for a higher class than its tenant may use
    # the hash of the key it was recognised by (None: the anonymous tenant), so that a reload
    # that removes that key reaches its requests still queued (a hash, never the key)
    key_hash: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Unauthorized:
    reason: AuthFailure

    @property
    def message(self) -> str:
        if self.reason is AuthFailure.MISSING_KEY:
            return "missing API key: send `authorization: Bearer <key>`"
        return "invalid API key"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `authorization: Bearer TOKEN` value (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class Classifier:
    """Built once per policy; `classify` is a couple of dict lookups and one sha256."""

    __slots__ = ("_anonymous", "_by_hash", "_priorities")

    def __init__(self, policy: Policy) -> None:
        self._by_hash: dict[str, TenantSpec] = {
            h: t for t in policy.tenants for h in t.api_key_hashes
        }
        self._anonymous = policy.anonymous
        self._priorities: dict[str, int] = {}
        for q in policy.queues:
            self._priorities[str(q.priority)] = q.priority
            self._priorities[f"p{q.priority}"] = q.priority
            self._priorities[q.name.lower()] = q.priority

    def __repr__(self) -> str:
        return f"Classifier(tenants={len({t.name for t in self._by_hash.values()})})"

    def priority_of(self, requested: str | None) -> int | None:
        """The queue priority a header value names ("1", "P1", "p1", a queue name), or None."""
        if requested is None:
            return None
        return self._priorities.get(requested.strip().lower())

    def tenant_of(self, authorization: str | None
                  ) -> tuple[TenantSpec, str | None] | Unauthorized:
        """The tenant a request's key names, with the key's hash (None for the anonymous
        tenant, which a missing or unknown key runs as when the policy has one)."""
        token = bearer_token(authorization)
        if token is not None:
            key_hash = hash_api_key(token)
            tenant = self._by_hash.get(key_hash)
            if tenant is not None:
                return tenant, key_hash
        if self._anonymous is not None:
            return self._anonymous, None
        return Unauthorized(AuthFailure.MISSING_KEY if token is None else AuthFailure.UNKNOWN_KEY)

    def classify(self, authorization: str | None,
                 requested_priority: str | None) -> Classified | Unauthorized:
        found = self.tenant_of(authorization)
        if isinstance(found, Unauthorized):
            return found
        tenant, key_hash = found
        requested = self.priority_of(requested_priority)
        if requested is None:
            return Classified(tenant.name, tenant.default_priority, key_hash=key_hash)
        if requested < tenant.max_priority:
            return Classified(tenant.name, tenant.max_priority, clamped=True, key_hash=key_hash)
        return Classified(tenant.name, requested, key_hash=key_hash)

