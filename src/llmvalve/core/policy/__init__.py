"""The admission policy: its values (`spec`) and their loader (YAML → `Policy`).

    spec       the policy as frozen values (what the rest of the core reads)
    load       `load_policy(text)`; `load_policy_source(path, read)` with the caller's IO
    nodes      the node reader: typed values with line marks, every issue collected
    document   one YAML document; the policy inside a Kubernetes ConfigMap
    queues, limiter, pools, tenants, budgets, features, requests   one module per section

The package does no IO; `llmvalve.gateway.policy_file` reads policy files.
"""

from llmvalve.core.policy.load import load_policy, load_policy_source
from llmvalve.core.policy.nodes import PolicyError, PolicyIssue, parse_duration
from llmvalve.core.policy.spec import (
    SEED_QUEUES,
    AdaptiveLimitSpec,
    BackendSpec,
    BreakerSpec,
    Budget,
    BudgetSpec,
    DropPolicy,
    FallbackSpec,
    FeatureSpec,
    LimiterSpec,
    Policy,
    PoolSpec,
    QueueSpec,
    RequestSpec,
    RetryAfterSpec,
    SchedulerSpec,
    SeedLimitSpec,
    Slo,
    StaticLimitSpec,
    TenantSpec,
)
from llmvalve.core.policy.tenants import hash_api_key

__all__ = [
    "SEED_QUEUES", "AdaptiveLimitSpec", "BackendSpec", "BreakerSpec", "Budget", "BudgetSpec",
    "DropPolicy", "FallbackSpec", "FeatureSpec", "LimiterSpec", "Policy", "PolicyError",
    "PolicyIssue", "PoolSpec", "QueueSpec", "RequestSpec", "RetryAfterSpec", "SchedulerSpec",
    "SeedLimitSpec", "Slo", "StaticLimitSpec", "TenantSpec", "hash_api_key", "load_policy",
    "load_policy_source", "parse_duration",
]
