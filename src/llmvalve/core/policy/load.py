"""Load and validate the admission policy: YAML text → `Policy`.

Theory of operation: the text is composed with its line marks (`document`), then walked section
by section, one module per section (`queues`, `limiter`, `pools`, `tenants`, `features`,
`requests`), each recording a `PolicyIssue` (source, line, field path, message) for every
problem instead of stopping at the first. Only when the walk finds nothing wrong is a `Policy`
returned; otherwise one `PolicyError` carries all the issues, sorted by line.

This package does no IO: `load_policy_source` is given the caller's `read` for the policy file
and its optional `secretsFile` (tenant name → list of key hashes, merged into the tenants);
`llmvalve.gateway.policy_file.load_policy_file` passes the file system's.

`Policy.version` is the first 12 hex digits of sha256 of the policy text, ending in one
newline (the inner `policy.yaml` text for a ConfigMap, `|` or `|-`; the secrets text is appended
when secrets are merged).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import PurePath

from yaml.nodes import MappingNode, Node

from llmvalve.core.policy.document import policy_root, secrets_ref
from llmvalve.core.policy.features import read_features
from llmvalve.core.policy.limiter import read_limiter
from llmvalve.core.policy.nodes import NodeReader, PolicyError, PolicyIssue, sort_issues
from llmvalve.core.policy.pools import read_pools
from llmvalve.core.policy.queues import finish_queues, read_queues, read_scheduler
from llmvalve.core.policy.requests import read_requests, read_retry_after
from llmvalve.core.policy.spec import Policy
from llmvalve.core.policy.tenants import (
    finish_tenants,
    merge_secrets,
    read_anonymous,
    read_tenants,
)

TOP_KEYS = ("queues", "scheduler", "limiter", "pools", "tenants", "anonymous", "features",
            "retryAfter", "requests", "failureModeAllow", "secretsFile")


def load_policy(text: str, source: str = "policy.yaml", *,
                secrets: tuple[str, str] | None = None) -> Policy:
    """Parse and validate a policy (bare, or a ConfigMap holding policy.yaml).

    `source` names the file in error messages. `secrets` is (text, source name) of a secrets
    file to merge (tenant name → list of "sha256:<hex>"); `load_policy_source` reads it for you.
    Raises `PolicyError` listing every issue.
    """
    issues: list[PolicyIssue] = []
    unwrapped = policy_root(text, source, issues)
    if unwrapped is None:
        raise PolicyError(sort_issues(issues, source))
    root, policy_text, r = unwrapped
    return _policy_of(root, policy_text, r, source, secrets)


def load_policy_node(node: Node, text: str, source: str) -> Policy:
    """A policy already read as a YAML node of a larger document (a simulated scenario's
    `policy:` mapping, whose anchors may stand elsewhere in its file); `text`, the node's own
    text, gives the policy its version. Raises `PolicyError` as `load_policy` does."""
    r = NodeReader(source, 0, [])
    r.prepare(node)
    return _policy_of(node, text, r, source, None)


def _policy_of(root: Node, policy_text: str, r: NodeReader, source: str,
               secrets: tuple[str, str] | None) -> Policy:
    issues = r.issues
    if not isinstance(root, MappingNode):
        r.type_error(root, "policy", "a mapping with at least `queues:`")
        raise PolicyError(sort_issues(issues, source))
    top = r.fields(root, "", TOP_KEYS, free_prefix="x-")
    drafts, queues_ok = read_queues(top)
    queues = finish_queues(r, drafts, top.key_node("queues"))
    queues_ok = queues_ok and bool(queues)
    scheduler = read_scheduler(top)
    pools = read_pools(top, queues, queues_ok)
    limiter = read_limiter(top, pools)
    tenant_drafts = read_tenants(top, queues, queues_ok, pools)
    anonymous = read_anonymous(top, queues, queues_ok, tenant_drafts)
    secrets_node = top.get("secretsFile")
    if secrets_node is not None:
        r.string(secrets_node, "secretsFile")
    if secrets is not None:
        merge_secrets(secrets, tenant_drafts, issues)
    keys_elsewhere = secrets_node is not None or secrets is not None
    tenants = finish_tenants(tenant_drafts, anonymous, keys_elsewhere, r)
    features = read_features(top, pools)
    retry_after = read_retry_after(top)
    requests = read_requests(top)
    failure_mode_allow = top.boolean("failureModeAllow", False)
    bound = [t.name for t in tenants if t.model_bound]
    if requests.body_inspection is False and bound:
        node = top.get("requests")
        r.error(node, "requests.bodyInspection", "must be on: the model of a request is read "
                "from its body for tenants that may use only some models or have budgets per "
                f"model ({', '.join(bound)})")
    if issues:
        raise PolicyError(sort_issues(issues, source))
    # the text as a file holds it: `|-` in a ConfigMap drops the final newline a file has
    policy_text = policy_text.rstrip("\n") + "\n"
    hashed = policy_text if secrets is None else policy_text + "\0" + secrets[0]
    return Policy(
        queues=queues, scheduler=scheduler, limiter=limiter, pools=pools, tenants=tenants,
        anonymous=anonymous, features=features, retry_after=retry_after, requests=requests,
        failure_mode_allow=failure_mode_allow,
        version=hashlib.sha256(hashed.encode("utf-8")).hexdigest()[:12],
    )


def load_policy_source(source: str, read: Callable[[str], str]) -> Policy:
    """Load the policy file `source` and its `secretsFile` (relative to it), both read with
    `read` (the caller's IO: path → text; OSError or UnicodeDecodeError when it cannot).

    Errors name the file as given. Raises `PolicyError`; the policy's own read error
    propagates, an unreadable secrets file is one more issue at the `secretsFile` line.
    """
    text = read(source)
    issues: list[PolicyIssue] = []
    found = policy_root(text, source, issues)  # composed once: over a second for 5,000 tenants
    if found is None:
        raise PolicyError(sort_issues(issues, source))
    root, policy_text, r = found
    ref = secrets_ref(root, r)
    if ref is None:
        return _policy_of(root, policy_text, r, source, None)
    name, line = ref
    secrets_path = str(PurePath(source).parent / name)
    try:
        secrets_text = read(secrets_path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        issue = PolicyIssue(source, line, "secretsFile",
                            f"cannot read secrets file {secrets_path!r}: {reason}")
        try:
            _policy_of(root, policy_text, r, source, None)
        except PolicyError as err:
            raise PolicyError(sort_issues([*err.errors, issue], source)) from None
        raise PolicyError([issue]) from None
    return _policy_of(root, policy_text, r, source, (secrets_text, secrets_path))
