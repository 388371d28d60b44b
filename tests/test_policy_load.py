"""Policy loading: the seed as published, defaults, every validation rule, line numbers."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path

import pytest

from llmvalve.core.policy import (
    SEED_QUEUES,
    BackendSpec,
    DropPolicy,
    FallbackSpec,
    FeatureSpec,
    LimiterSpec,
    PolicyError,
    PolicyIssue,
    PoolSpec,
    QueueSpec,
    RequestSpec,
    Slo,
    TenantSpec,
    document,
    hash_api_key,
    load_policy,
)
from llmvalve.gateway.policy_file import load_policy_file

HERE = Path(__file__).parent
DATA = HERE / "data"
CASES = sorted((HERE / "policy_cases").glob("*.yaml"))
DOCS = HERE.parent / "docs" / "policy.md"
DEFAULT_POLICY = Path(str(resources.files("llmvalve") / "data" / "default-policy.yaml"))

KEY_A = hash_api_key("key-a")
KEY_B = hash_api_key("key-b")

ONE_QUEUE = "queues:\n  - {priority: 0, name: q, maxQueueSize: 10, timeout: 1s, dropPolicy: tail}\n"
SEED_BARE = (DATA / "seed-policy.yaml").read_text()


def errors_of(text: str, source: str = "p.yaml", **kw) -> list[PolicyIssue]:
    with pytest.raises(PolicyError) as info:
        load_policy(text, source, **kw)
    return info.value.errors


# ----------------------------------------------------------------------------- the seed


def test_test_data_is_the_published_seed():
    shared = HERE.parent.parent / "shared" / "seed" / "policy-configmap.yaml"
    if not shared.exists():
        pytest.skip("shared/seed is not beside this checkout")
    assert (DATA / "seed-policy-configmap.yaml").read_text() == shared.read_text()


def test_seed_configmap_loads_exactly_as_published():
    text = (DATA / "seed-policy-configmap.yaml").read_text()
    policy = load_policy(text, "seed-policy-configmap.yaml")
    assert policy.queues == SEED_QUEUES
    assert [q.drop_policy for q in policy.queues] == [
        DropPolicy.TAIL, DropPolicy.EARLY_DROP_ON_PRESSURE, DropPolicy.FAST_REJECT]
    assert policy.limiter == LimiterSpec()
    assert policy.pools == (PoolSpec(),)
    assert policy.tenants == ()
    assert policy.anonymous == TenantSpec("anonymous", (), 0, 1)
    assert policy.features == ()
    assert policy.failure_mode_allow is False


def test_bare_seed_and_configmap_give_the_same_policy_and_version():
    bare = load_policy_file(DATA / "seed-policy.yaml")
    wrapped = load_policy_file(DATA / "seed-policy-configmap.yaml")
    assert bare == wrapped
    assert bare.version == hashlib.sha256(SEED_BARE.encode()).hexdigest()[:12]
    assert re.fullmatch(r"[0-9a-f]{12}", bare.version)


def test_version_changes_with_the_text():
    a = load_policy(SEED_BARE)
    b = load_policy(SEED_BARE.replace("timeout: 8s", "timeout: 9s"))
    assert a.version != b.version
    assert b.queues[0].timeout_s == 9.0


def test_configmap_errors_point_at_lines_of_the_outer_file():
    text = (DATA / "seed-policy-configmap.yaml").read_text()
    lines = text.splitlines()
    broken = text.replace("dropPolicy: early-drop-on-pressure", "dropPolicy: early")
    [issue] = errors_of(broken, "cm.yaml")
    assert issue.field == "queues[1].dropPolicy"
    assert "dropPolicy: early-drop-on-pressure" in lines[issue.line - 1]
    assert str(issue).startswith(f"cm.yaml:{issue.line}: queues[1].dropPolicy: ")


def test_a_configmap_with_a_chomped_block_shares_the_bare_files_version():
    cm = (DATA / "seed-policy-configmap.yaml").read_text()
    assert "policy.yaml: |\n" in cm
    chomped = load_policy(cm.replace("policy.yaml: |\n", "policy.yaml: |-\n"))
    assert chomped.version == load_policy(SEED_BARE).version


def test_an_exponent_yaml_reads_as_text_gets_a_hint_that_fits_the_field():
    text = SEED_BARE + "requests: {maxBodyBytes: 1e9, bytesPerToken: 4e0}\n"
    by_field = {i.field: i.message for i in errors_of(text)}
    assert by_field["requests.maxBodyBytes"].endswith("(YAML reads 1e9 as text: write the digits)")
    assert "1.0e+9, or the digits" in by_field["requests.bytesPerToken"]


def test_keys_of_ones_own_hold_anchors_at_the_top_level():
    text = """x-queue: &q {maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
queues:
  - {<<: *q, priority: 0, name: rt}
  - {<<: *q, priority: 1, name: batch, timeout: 30s}
"""
    p = load_policy(text)
    assert [(q.name, q.timeout_s) for q in p.queues] == [("rt", 8.0), ("batch", 30.0)]
    [issue] = errors_of(text.replace("x-queue:", "defaults:"))
    assert issue.field == "defaults" and "starts with 'x-'" in issue.message


def test_a_reroute_may_name_a_model_only_the_catch_all_pool_takes():
    text = """queues: [{priority: 0, name: rt, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}]
pools:
  - {name: main}
  - {name: small, models: [tiny]}
features:
  - {name: summarize, fallback: {type: reroute, model: big-model}}
"""
    p = load_policy(text)
    assert p.pool_for_model(p.features[0].fallback.model).name == "main"


CARVED = """queues:
  - {priority: 0, name: rt, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
  - {priority: 1, name: batch, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
pools:
  - {name: shared}
  - {name: small, models: [tiny]}
  - {name: lane, cluster: lane, priorities: [0]}
"""


def test_a_pool_with_priorities_takes_its_classes_out_of_the_model_s_pool():
    p = load_policy(CARVED)
    for model in ("big", "tiny", None):
        assert p.pool_for_model(model, 0).name == "lane"
    assert [p.pool_for_model(m, 1).name for m in ("big", "tiny", None)] == [
        "shared", "small", "shared"]
    assert p.pool_for_model("big").name == "shared"  # a class-blind check: the model's pool
    assert p.model_picks_pool  # shared and small: by model
    lane_only = load_policy(CARVED.replace("  - {name: small, models: [tiny]}\n", ""))
    assert not lane_only.model_picks_pool  # a body too large to read keeps its pool
    only_tiny = load_policy(CARVED.replace("priorities: [0]", "models: [tiny], priorities: [0]"))
    assert [only_tiny.pool_for_model(m, 0).name for m in ("big", "tiny")] == ["shared", "lane"]
    # a priority is written as elsewhere in the policy: 0, "P0" or the queue's name
    for written in ("P0", "rt"):
        named = load_policy(CARVED.replace("priorities: [0]", f"priorities: [{written}]"))
        assert named.pool_for_model("big", 0).name == "lane"


@pytest.mark.parametrize("edit, field, message", [
    (("priorities: [0]", "priorities: [0, 5]"), "pools[2].priorities[1]",
     "no queue has priority 5; queues: 0 (rt), 1 (batch)"),
    (("priorities: [0]", "priorities: [P0, rt]"), "pools[2].priorities[1]",
     "duplicate priority 0"),
    (("priorities: [0]", "priorities: [urgent]"), "pools[2].priorities[0]",
     "'urgent' is not a queue priority or name"),
    (("  - {name: lane, cluster: lane, priorities: [0]}\n",
      "  - {name: lane, cluster: lane, priorities: [0]}\n"
      "  - {name: lane2, cluster: lane2, priorities: [1, 0]}\n"),
     "pools[3].priorities", "P0 is already taken by pool 'lane'"),
    (("  - {name: lane, cluster: lane, priorities: [0]}\n",
      "  - {name: lane, cluster: lane, priorities: [0]}\n"
      "  - {name: lane2, cluster: lane2, models: [tiny], priorities: [0]}\n"),
     "pools[3].priorities", "P0 is already taken by pool 'lane' for a model this pool serves"),
    (("  - {name: shared}\n", "  - {name: shared, cluster: shared, priorities: [1]}\n"),
     "pools[0].priorities",
     "the first pool takes requests that name no model and Envoy's default route"),
    (("{name: lane, cluster: lane,", "{name: lane,"), "pools[2].cluster",
     "a pool with `priorities` needs a cluster of its own ('llm_backends' is another pool's)"),
    # whichever comes first (a pool listed after it was not checked)
    (("  - {name: lane, cluster: lane, priorities: [0]}\n",
      "  - {name: lane, cluster: lane, priorities: [0]}\n"
      "  - {name: more, cluster: lane, models: [huge]}\n"), "pools[2].cluster",
     "needs a cluster of its own ('lane' is another pool's)"),
    (("  - {name: shared}\n", "  - {name: shared, models: [big]}\n"
      "  - {name: only, cluster: only, models: [other], priorities: [1]}\n"),
     "pools[1].models", "'other' is served by no pool for every class"),
])
def test_pool_priorities_errors_name_the_field(edit, field, message):
    issues = errors_of(CARVED.replace(*edit))
    assert [(i.field, message in i.message) for i in issues] == [(field, True)], issues


def test_multi_document_manifest_picks_the_configmap():
    cm = (DATA / "seed-policy-configmap.yaml").read_text()
    other = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: gw}\n"
    text = other + "---\n" + cm.replace("timeout: 60s", "timeout: 0s")
    [issue] = errors_of(text, "all.yaml")
    assert issue.field == "queues[2].timeout"
    assert text.splitlines()[issue.line - 1].strip() == "timeout: 0s"
    assert load_policy(other + "---\n" + cm).queues == SEED_QUEUES
    envoy = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: envoy}\ndata: {envoy.yaml: x}\n"
    assert load_policy(envoy + "---\n" + cm + "---\n" + other).queues == SEED_QUEUES


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize(("written", "seconds"), [
    ("8s", 8.0), ("150ms", 0.15), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0),
    ("1m30s", 90.0), ("3", 3.0), ("2.5", 2.5), ("'4'", 4.0), (".5s", 0.5),
])
def test_durations(written, seconds):
    policy = load_policy(ONE_QUEUE.replace("timeout: 1s", f"timeout: {written}"))
    assert policy.queues[0].timeout_s == pytest.approx(seconds)


@pytest.mark.parametrize("written", ["8 seconds", "s", "ms", "1.5.s", "8sec", "''", "true",
                                     "[8]"])
def test_bad_durations(written):
    [issue] = errors_of(ONE_QUEUE.replace("timeout: 1s", f"timeout: {written}"))
    assert issue.field == "queues[0].timeout"
    assert issue.line == 2


def test_defaults_by_rank_of_priority_and_sorted_queues():
    text = """queues:
  - {priority: 30, name: d, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}
  - {priority: 5, name: a, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}
  - {priority: 20, name: c, maxQueueSize: 1, timeout: 1s, dropPolicy: fast-reject}
  - priority: 10
    name: b
    maxQueueSize: 1
    timeout: 1s
    dropPolicy: early-drop-on-pressure
    slo: {ttft: 3s}
    reservedShare: 0.25
"""
    policy = load_policy(text)
    assert [q.priority for q in policy.queues] == [5, 10, 20, 30]
    assert [q.name for q in policy.queues] == ["a", "b", "c", "d"]
    assert [q.slo for q in policy.queues] == [
        Slo(2.0, 0.15), Slo(3.0, 0.3), Slo(60.0, 1.0), Slo(60.0, 1.0)]
    assert [q.reserved_share for q in policy.queues] == [0.3, 0.25, 0.0, 0.0]
    # Tenant and anonymous defaults follow the classes present: highest, second.
    assert policy.anonymous == TenantSpec("anonymous", (), 5, 10)


def test_extended_keys_map_to_fields():
    text = ONE_QUEUE + f"""
scheduler: {{starvationAfter: 2s, starvationEvery: 4, pressureThreshold: 0.8}}
limiter:
  controller: seed
  static: {{limit: 32}}
  seed: {{minLimit: 2, maxLimit: 100, alpha: 0.2, beta: 0.4}}
  adaptive:
    initialLimitTokens: 50000
    minLimitTokens: 1000
    maxLimitTokens: 100000
    window: 250ms
    minSamples: 5
    kvTarget: 0.8
    waitingTarget: 3
    queueTarget: 0
    itlTarget: 50ms
    staleAfter: 3s
    maxGrowth: 1.5
    decreaseOnDrop: 0.8
pools:
  - name: main
    cluster: vllm_pool
    engine: sglang
    backends:
      - {{name: gpu-0, metricsUrl: "http://10.0.0.1:8000/metrics", kvCapacityTokens: 131072,
          maxNumSeqs: 256}}
      - {{name: gpu-1}}
    maxNumSeqs: 64
    scrapeInterval: 1s
    scrapeTimeout: 800ms
    breaker: {{failureRatio: 0.3, minRequests: 5, window: 30s, open: 10s}}
    leaseTimeout: 10m
tenants:
  - name: app
    apiKeyHashes: [{KEY_A}]
features:
  - {{name: suggest, fallback: {{type: static, content: "later"}}}}
  - {{name: summarize, fallback: {{type: reroute, cluster: small_model, model: tiny}}}}
  - {{name: plain}}
retryAfter: {{min: 2s, max: 30s, jitter: 0.1}}
requests:
  priorityHeader: X-Priority
  featureHeader: x-feature
  deadlineHeader: x-deadline
  retryCountHeader: X-Retry-Count
  modelHeader: X-Model
  bodyInspection: true
  maxBodyBytes: 1024
  defaultMaxTokens: 128
  bytesPerToken: 3.5
failureModeAllow: true
"""
    p = load_policy(text)
    assert (p.scheduler.starvation_after_s, p.scheduler.starvation_every,
            p.scheduler.pressure_threshold) == (2.0, 4, 0.8)
    assert p.limiter.controller == "seed"
    assert p.limiter.static.limit == 32
    assert (p.limiter.seed.min_limit, p.limiter.seed.max_limit) == (2, 100)
    assert (p.limiter.seed.alpha, p.limiter.seed.beta) == (0.2, 0.4)
    a = p.limiter.adaptive
    assert (a.initial_limit_tokens, a.min_limit_tokens, a.max_limit_tokens) == (5e4, 1e3, 1e5)
    assert (a.window_s, a.min_samples, a.kv_target, a.waiting_target) == (0.25, 5, 0.8, 3.0)
    assert (a.queue_target_s, a.itl_target_s, a.stale_after_s) == (0.0, 0.05, 3.0)
    assert (a.max_growth, a.decrease_on_drop) == (1.5, 0.8)
    [pool] = p.pools
    assert (pool.name, pool.cluster, pool.engine) == ("main", "vllm_pool", "sglang")
    assert pool.backends == (BackendSpec("gpu-0", "http://10.0.0.1:8000/metrics", 131072, 256),
                             BackendSpec("gpu-1", ""))
    assert (pool.stated_max_num_seqs("gpu-0"), pool.stated_max_num_seqs("gpu-1")) == (256, 64)
    assert (pool.scrape_interval_s, pool.scrape_timeout_s, pool.lease_timeout_s) == (1, .8, 600)
    b = pool.breaker
    assert (b.failure_ratio, b.min_requests, b.window_s, b.open_s) == (0.3, 5, 30.0, 10.0)
    assert p.tenants == (TenantSpec("app", (KEY_A,), 0, 0),)
    assert p.features == (
        FeatureSpec("suggest", FallbackSpec("static", content="later")),
        FeatureSpec("summarize", FallbackSpec("reroute", cluster="small_model", model="tiny")),
        FeatureSpec("plain", None),
    )
    assert (p.retry_after.min_s, p.retry_after.max_s, p.retry_after.jitter) == (2, 30, 0.1)
    assert p.requests == RequestSpec("x-priority", "x-feature", "x-deadline", "x-model", True,
                                     1024, 128, 3.5, retry_count_header="x-retry-count")
    assert p.failure_mode_allow is True


def test_yaml_anchors_and_merge_keys():
    text = """common: &common {maxQueueSize: 10, timeout: 5s, dropPolicy: tail}
queues:
  - {<<: *common, priority: 0, name: a}
  - {<<: *common, priority: 1, name: b, timeout: 9s}
"""
    [issue] = errors_of(text)  # anchors must live inside policy keys; overrides are fine
    assert issue.field == "common" and issue.line == 1
    _, issue = errors_of(text.replace("name: b, timeout: 9s", "name: b, name: c"))
    assert (issue.line, issue.field) == (4, "queues[1].name")
    assert issue.message.startswith("duplicate key")
    text = """queues:
  - &base {priority: 0, name: a, maxQueueSize: 10, timeout: 5s, dropPolicy: tail}
  - {<<: *base, priority: 1, name: b, timeout: 9s}
"""
    policy = load_policy(text)
    assert [(q.name, q.max_queue_size, q.timeout_s) for q in policy.queues] == [
        ("a", 10, 5.0), ("b", 10, 9.0)]


def test_merge_key_override_is_not_a_duplicate_even_when_resolved_through_another_mapping():
    # tenants[0] is read first and resolves `anonymous`'s own merge in place; anonymous's own
    # defaultPriority must still count as an override, not as a duplicate key.
    text = SEED_BARE + f"""anonymous: &anon
  {{<<: {{maxPriority: 0, defaultPriority: 1}}, defaultPriority: 2}}
tenants:
  - {{<<: *anon, name: t, apiKeyHashes: [{KEY_A}]}}
"""
    policy = load_policy(text)
    assert policy.anonymous == TenantSpec("anonymous", (), 0, 2)
    assert policy.tenants == (TenantSpec("t", (KEY_A,), 0, 2),)


# ----------------------------------------------------------------------------- tenants


def tenants_policy(tenants: str, anonymous: str | None = None) -> str:
    text = SEED_BARE + "tenants:\n" + tenants
    if anonymous is not None:
        text += "anonymous: " + anonymous + "\n"
    return text


def test_tenant_priority_forms_and_defaults():
    p = load_policy(tenants_policy(f"""  - {{name: a, apiKeyHashes: [{KEY_A}]}}
  - {{name: b, apiKeyHashes: [{KEY_B}], maxPriority: P2}}
  - name: c
    apiKeyHashes: ["{hash_api_key('c')}"]
    maxPriority: agent-workflow
    defaultPriority: p2
"""))
    assert [(t.name, t.max_priority, t.default_priority) for t in p.tenants] == [
        ("a", 0, 1), ("b", 2, 2), ("c", 1, 2)]
    assert p.tenants[0].api_key_hashes == (KEY_A,)


@pytest.mark.parametrize(("written", "expected"), [
    (None, TenantSpec("anonymous", (), 0, 1)),
    ("true", TenantSpec("anonymous", (), 0, 1)),
    ("null", None),
    ("false", None),
    ("", None),
    ("{maxPriority: 1}", TenantSpec("anonymous", (), 1, 1)),
    ("{maxPriority: 1, defaultPriority: batch-extraction}", TenantSpec("anonymous", (), 1, 2)),
])
def test_anonymous(written, expected):
    assert load_policy(tenants_policy(f"  - {{name: a, apiKeyHashes: [{KEY_A}]}}\n",
                                      written)).anonymous == expected


def test_the_default_anonymous_tenant_never_outranks_a_keyed_one():
    """A tenant capped at P2 that drops its key (or sends a wrong one) must not become an
    anonymous client allowed P0: the default anonymous maximum is the tenants' lowest."""
    tenants = (f"  - {{name: a, apiKeyHashes: [{KEY_A}], maxPriority: 0}}\n"
               f"  - {{name: b, apiKeyHashes: [{KEY_B}], maxPriority: P2}}\n")
    for written in (None, "true"):
        assert load_policy(tenants_policy(tenants, written)).anonymous == TenantSpec(
            "anonymous", (), 2, 2)
    # an operator who means it says so
    assert load_policy(tenants_policy(tenants, "{maxPriority: 0}")).anonymous.max_priority == 0
    assert load_policy(SEED_BARE).anonymous == TenantSpec("anonymous", (), 0, 1)  # no tenants


def test_tenant_named_anonymous_conflicts_only_when_anonymous_is_enabled():
    t = f"  - {{name: anonymous, apiKeyHashes: [{KEY_A}]}}\n"
    [issue] = errors_of(tenants_policy(t))
    assert issue.field == "tenants[0].name"
    assert load_policy(tenants_policy(t, "null")).tenants[0].name == "anonymous"


def test_tenant_without_keys_is_an_error_unless_keys_come_from_secrets():
    [issue] = errors_of(tenants_policy("  - name: a\n"))
    assert issue.field == "tenants[0].apiKeyHashes" and "hash-key" in issue.message
    with_file = "secretsFile: s.yaml\n" + tenants_policy("  - name: a\n")
    assert load_policy(with_file).tenants == (TenantSpec("a", (), 0, 1),)


@pytest.mark.parametrize("entry", [
    "sk-live-SuperSecret123",  # plain key
    "SuperSecret123 with spaces",
    "sha256:SuperSecret123",  # prefix, wrong body
])
def test_key_values_are_never_echoed(entry):
    for text in (tenants_policy(f"  - {{name: a, apiKeyHashes: ['{entry}']}}\n"),
                 tenants_policy(f"  - {{name: a, apiKeyHashes: '{entry}'}}\n"),
                 tenants_policy(f"  - {{name: a, apiKeyHashes: ['{entry}'\n")):  # syntax error
        errors = errors_of(text)
        assert errors
        rendered = "\n".join(str(e) for e in errors)
        assert "SuperSecret123" not in rendered


def test_plain_key_message_tells_how_to_hash():
    [issue] = errors_of(tenants_policy("  - {name: a, apiKeyHashes: [sk-abcdef0123]}\n"))
    assert issue.field == "tenants[0].apiKeyHashes[0]"
    assert "plaintext API key" in issue.message and "llmvalve policy hash-key" in issue.message


def test_hash_without_prefix():
    digest = KEY_A.removeprefix("sha256:")
    [issue] = errors_of(tenants_policy(f"  - {{name: a, apiKeyHashes: [{digest}]}}\n"))
    assert "sha256:" in issue.message and digest not in issue.message
    assert "hash-key" in issue.message  # 64 hex digits may be the key itself


def test_hash_api_key_known_vector():
    assert hash_api_key("abc") == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


# ----------------------------------------------------------------------------- secrets file


def write_policy_with_secrets(tmp_path: Path, secrets: str) -> Path:
    policy = tmp_path / "conf" / "policy.yaml"
    policy.parent.mkdir()
    policy.write_text("secretsFile: keys/secrets.yaml\n"
                      + tenants_policy(f"  - name: a\n  - {{name: b, apiKeyHashes: [{KEY_B}]}}\n"))
    (policy.parent / "keys").mkdir()
    (policy.parent / "keys" / "secrets.yaml").write_text(secrets)
    return policy


def test_secrets_file_is_merged_relative_to_the_policy(tmp_path, monkeypatch):
    policy = write_policy_with_secrets(tmp_path, f"a: [{KEY_A}]\nb: ['{hash_api_key('b2')}']\n")
    monkeypatch.chdir(tmp_path)  # not the policy's directory
    p = load_policy_file(policy)
    assert p.tenants[0].api_key_hashes == (KEY_A,)
    assert p.tenants[1].api_key_hashes == (KEY_B, hash_api_key("b2"))
    without = load_policy(policy.read_text(), "policy.yaml")
    assert without.tenants[0].api_key_hashes == ()
    assert p.version != without.version


def test_secrets_file_errors_name_the_secrets_file(tmp_path):
    policy = write_policy_with_secrets(tmp_path, f"a: [{KEY_A}]\nc: [{KEY_B}]\nb: [{KEY_A}]\n")
    with pytest.raises(PolicyError) as info:
        load_policy_file(policy)
    secrets = str(policy.parent / "keys" / "secrets.yaml")
    rendered = [str(e) for e in info.value.errors]
    assert len(rendered) == 2
    assert rendered[0] == f"{secrets}:2: secrets: this key names no tenant of the policy " \
        "(tenants: a, b)"
    assert rendered[1].startswith(f"{secrets}:3: b[0]: this key hash is already listed for "
                                  "tenant 'a'")


def test_a_secrets_file_written_key_to_tenant_never_prints_the_key(tmp_path):
    policy = write_policy_with_secrets(tmp_path, '"sk-live-SuperSecret123": a\n')
    with pytest.raises(PolicyError) as info:
        load_policy_file(policy)
    [issue] = info.value.errors
    assert issue.line == 1 and "names no tenant" in issue.message
    assert "SuperSecret123" not in str(issue)


@pytest.mark.parametrize("text", ['a: *sk-live-SuperSecret123\n',
                                  'a: !sk-live-SuperSecret123 x\n',
                                  'a: [!sk-live-SuperSecret123 x]\n'])
def test_a_key_pasted_as_an_alias_or_a_tag_is_never_printed(tmp_path, text):
    """Found by a review: YAML's own messages quote an alias it cannot find and a tag it does
    not know, and the secrets file's errors passed them on."""
    policy = write_policy_with_secrets(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy_file(policy)
    assert info.value.errors and all(e.line == 1 for e in info.value.errors)
    assert "SuperSecret123" not in "\n".join(map(str, info.value.errors))


def test_a_tenant_listed_twice_in_the_secrets_file_is_an_error(tmp_path):
    # rotating a key by listing the tenant again would leave the old key live
    policy = write_policy_with_secrets(tmp_path, f"a: [{KEY_A}]\na: ['{hash_api_key('a2')}']\n")
    with pytest.raises(PolicyError) as info:
        load_policy_file(policy)
    [issue] = info.value.errors
    assert (issue.line, issue.field) == (2, "a") and "listed twice" in issue.message


def test_missing_secrets_file_is_reported_at_the_secrets_file_line(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(SEED_BARE + "secretsFile: nope.yaml\n")
    with pytest.raises(PolicyError) as info:
        load_policy_file(policy)
    [issue] = info.value.errors
    assert (issue.source, issue.line, issue.field) == (str(policy), 17, "secretsFile")


@pytest.mark.parametrize("secrets", [False, True])
def test_a_policy_file_is_composed_once(tmp_path, monkeypatch, secrets):
    """Composing is most of a load (about a second for 5,000 tenants in pure-Python YAML): a
    load composed the file twice, to find its secretsFile and again to read it, and the
    watcher a third time at each change to find the file it watches."""
    composed = []
    real = document.compose_document
    monkeypatch.setattr(document, "compose_document",
                        lambda *a, **k: composed.append(1) or real(*a, **k))
    if secrets:
        policy = write_policy_with_secrets(tmp_path, f"a: [{KEY_A}]\n")
        assert load_policy_file(policy).tenants[0].api_key_hashes == (KEY_A,)
    else:
        policy = tmp_path / "p.yaml"
        policy.write_text(SEED_BARE)
        load_policy_file(policy)
    assert len(composed) == 1
    composed.clear()
    ref = document.secrets_file_ref(policy.read_text(), str(policy))
    assert ref == (("keys/secrets.yaml", 1) if secrets else None)
    assert len(composed) == secrets  # no word secretsFile, no escape: nothing to compose
    escaped = '"secrets\\x46ile": s.yaml\n' + SEED_BARE
    assert document.secrets_file_ref(escaped) == ("s.yaml", 1)


# ----------------------------------------------------------------------------- errors


def test_all_errors_are_collected_and_rendered_one_per_line():
    text = """queues:
  - {priority: 0, name: a, maxQueueSize: 0, timeout: 1s, dropPolicy: tail}
  - {priority: 0, name: a, maxQueueSize: 1, timeout: nope, dropPolicy: drop}
limiter: {controler: seed}
"""
    with pytest.raises(PolicyError) as info:
        load_policy(text, "x.yaml")
    lines = str(info.value).splitlines()
    assert lines == [
        "x.yaml:2: queues[0].maxQueueSize: must be > 0, got 0",
        "x.yaml:3: queues[1].priority: duplicate priority 0 (already used by queues[0])",
        "x.yaml:3: queues[1].name: duplicate queue name 'a' (already used by queues[0])",
        "x.yaml:3: queues[1].timeout: bad duration 'nope': use seconds (8, 1.5) or a number "
        "with a unit: 150ms, 8s, 1.5s, 2m, 1h",
        "x.yaml:3: queues[1].dropPolicy: unknown dropPolicy 'drop'; allowed: tail, "
        "early-drop-on-pressure, fast-reject",
        "x.yaml:4: limiter.controler: unknown key 'controler'; did you mean 'controller'?",
    ]


def test_request_paths():
    """The inference API by default (its methods too); a list of exact paths and prefixes,
    each with a method or for every method; `*` for every path."""
    spec = load_policy(SEED_BARE).requests
    for path in ("/v1/chat/completions", "/v1/completions?x=1", "/v1/chat/completions/",
                 "/v1/responses", "/tokenize", "/v2/rerank", "/v1/messages", "/v2/embed"):
        assert spec.passes("POST", path), path
        assert not spec.passes("GET", path) and spec.methods(path) == {"POST"}, path
    # a stored response: retrieved or cancelled
    assert spec.methods("/v1/responses/resp_1") == {"GET", "POST"}
    assert spec.passes("POST", "/v1/responses/resp_1/cancel")
    for path in ("/metrics", "/sleep", "/reset_prefix_cache", "/v1/load_lora_adapter", "/",
                 "", "/v1/chat/completionsX", "/v1/chat", "/version", "/v1/responsesX"):
        assert not spec.methods(path) and not spec.passes("POST", path), path
    spec = load_policy(SEED_BARE + "requests: {paths: [/v1/chat/completions, /gen*]}\n").requests
    assert spec.paths == ("/v1/chat/completions", "/gen*")
    assert spec.passes("GET", "/generate") and spec.passes("POST", "/gen")
    assert not spec.passes("POST", "/v1/completions")
    spec = load_policy(SEED_BARE + "requests: {paths: ['*']}\n").requests
    assert all(spec.passes("PUT", p) for p in ("/metrics", "/", "/v1/foo"))
    spec = load_policy(SEED_BARE + "requests: {paths: ['POST *', 'GET /v1/models/*', "
                       "/generate]}\n").requests
    assert spec.passes("POST", "/metrics") and not spec.passes("GET", "/metrics")
    assert spec.methods("/v1/models/m") == {"GET", "POST"} and spec.passes("PUT", "/generate")
    with pytest.raises(PolicyError, match=r"requests.paths: must list at least one path"):
        load_policy(SEED_BARE + "requests: {paths: []}\n")


def test_not_a_mapping_and_empty_documents():
    assert errors_of("")[0].message == "empty document"
    assert errors_of("# only a comment\n")[0].field == "policy"
    [issue] = errors_of("- 1\n- 2\n")
    assert issue.field == "policy" and "mapping" in issue.message


def test_an_empty_value_counts_as_absent():
    """`bodyInspection:` with no value keeps the default (on when pools name models), not off."""
    assert load_policy(SEED_BARE + "requests: {bodyInspection: }\n").requests.body_inspection \
        is None
    assert load_policy(SEED_BARE + "requests: {bodyInspection: false}\n") \
        .requests.body_inspection is False


def test_unknown_top_level_key_lists_or_suggests():
    [issue] = errors_of(SEED_BARE + "tennants: []\n")
    assert issue.field == "tennants" and "did you mean 'tenants'" in issue.message
    [issue] = errors_of(SEED_BARE + "kind: Policy\n")
    assert "allowed here: queues, scheduler" in issue.message


def test_cross_checks_are_skipped_when_a_queue_is_broken():
    # Queue 1's priority is unreadable: the tenant's reference to it must not add noise.
    text = f"""queues:
  - {{priority: 0, name: a, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}}
  - {{priority: one, name: b, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}}
tenants:
  - {{name: t, apiKeyHashes: [{KEY_A}], maxPriority: 1}}
"""
    [issue] = errors_of(text)
    assert issue.field == "queues[1].priority"


def parse_expectations(path: Path) -> list[str]:
    expects = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# expect: "):
            expects.append(line.removeprefix("# expect: "))
    return expects


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 15
    assert all(parse_expectations(c) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_broken_policy_corpus(case: Path):
    expects = parse_expectations(case)
    with pytest.raises(PolicyError) as info:
        load_policy_file(case)
    got = [str(e) for e in info.value.errors]
    prefix = f"{case}:"
    assert all(g.startswith(prefix) for g in got)
    got = [g.removeprefix(prefix) for g in got]
    for expect in expects:
        line, field, *message = expect.split(": ", 2)
        assert any(g.startswith(f"{line}: {field}: ") and (not message or message[0] in g)
                   for g in got), f"expected {expect!r} in {got}"
    assert len(got) == len(expects), got


# ----------------------------------------------------------------------------- shipped files


def test_default_policy_loads_with_demo_tenants():
    p = load_policy_file(DEFAULT_POLICY)
    assert p.queues == SEED_QUEUES
    assert p.anonymous is None
    assert p.tenants == (
        TenantSpec("interactive-app", (hash_api_key("sk-llmvalve-demo-p0"),), 0, 0),
        TenantSpec("batch-jobs", (hash_api_key("sk-llmvalve-demo-p2"),), 2, 2),
    )
    assert p.feature("suggest").fallback.kind == "static"
    assert p.feature("suggest").fallback.content
    assert p.feature("summarize").fallback == FallbackSpec("reroute", model="sim-tiny")
    assert [(q.name, q.models) for q in p.pools] == [("main", ()), ("small", ("sim-tiny",))]
    assert p.inspects_bodies  # several pools: the model in the body picks one
    assert "sk-llmvalve-demo-p0" in DEFAULT_POLICY.read_text()  # documented in a comment


def test_seed_queue_constant_matches_the_shared_seed():
    assert SEED_QUEUES[1] == QueueSpec(1, "agent-workflow", 500, 15.0,
                                       DropPolicy.EARLY_DROP_ON_PRESSURE, 0.1, Slo(8.0, 0.3))


def doc_examples() -> list[str]:
    text = DOCS.read_text()
    return [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "# example" in b]


def test_docs_examples_load():
    examples = doc_examples()
    assert len(examples) >= 2
    for block in examples:
        if "# example: invalid" in block:
            with pytest.raises(PolicyError):
                load_policy(block)
        else:
            load_policy(block, "docs")


def test_stale_after_left_out_follows_the_longest_scrape_interval():
    """Scraped every 5 s, a reading was stale after the 2 s default before the next came
    (tests/policy_cases/stale-before-the-next-scrape.yaml: given that short, an error)."""
    base = ("queues: [{priority: 0, name: p0, maxQueueSize: 9, timeout: 8s, dropPolicy: tail}]\n"
            "pools: [{name: a, scrapeInterval: 5s}, {name: b, models: [m], scrapeInterval: 1s}]\n")
    assert load_policy(base).limiter.adaptive.stale_after_s == 10.0
    assert load_policy(base.replace("5s", "0.5s")).limiter.adaptive.stale_after_s == 2.0
    given = load_policy(base + "limiter: {adaptive: {staleAfter: 6s}}\n").limiter.adaptive
    assert given.stale_after_s == 6.0 and given.stale_after_given
