"""YAML documents: the one document of a text, and the policy inside a Kubernetes ConfigMap.

Input is either the bare policy (`queues:` …) or a ConfigMap holding it under
`data."policy.yaml"`. For a ConfigMap, inner line numbers are shifted by the position of the
block scalar, so every reported line is a line of the file the user opened. Syntax errors are
reported without PyYAML's quote of the offending line (it may hold a secret).
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from llmvalve.core.policy.nodes import TAG, NodeReader, PolicyIssue


def compose_document(text: str, r: NodeReader, field: str) -> Node | None:
    """The single document of `text`, or None (issues recorded)."""
    try:
        docs = [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if d is not None]
    except yaml.YAMLError as exc:
        r.issues.append(syntax_issue(exc, text, r))
        return None
    except RecursionError:  # PyYAML's composer recurses once per level of nesting
        r.error(None, field, "nested too deeply to read (hundreds of levels)")
        return None
    if not docs:
        r.error(None, field, "empty document")
        return None
    if len(docs) > 1:
        if field != "policy":
            r.error(docs[1], field, f"{len(docs)} YAML documents; expected one")
            return None
        picked = [d for d in docs if holds_policy(d)]
        if len(picked) == 1:
            return picked[0]
        r.error(docs[1], field, f"{len(docs)} YAML documents; expected one policy "
                "(or one ConfigMap with data.\"policy.yaml\")")
        return None
    return docs[0]


def syntax_issue(exc: yaml.YAMLError, text: str, r: NodeReader) -> PolicyIssue:
    """Deliberately not str(exc): PyYAML quotes the offending line, which may hold a secret."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, max(0, exc.position))
        code = (f"#x{exc.character:04x}" if isinstance(exc.character, int)
                else repr(exc.character))
        return _text_issue(r, line, f"character {code} is not allowed in YAML ({exc.reason}); "
                           "a pasted terminal colour code or a binary file?")
    problem = getattr(exc, "problem", None) or type(exc).__name__
    context = getattr(exc, "context", None)
    problem_mark = getattr(exc, "problem_mark", None)
    context_mark = getattr(exc, "context_mark", None)
    line = problem_mark.line if problem_mark is not None else 0
    if context and context_mark is not None:
        started = (f"{context_mark.line + 1} of the string" if r.inline
                   else str(context_mark.line + 1 + r.offset))
        problem = f"{context} started on line {started}: {problem}"
        if line >= len(text.splitlines()):  # detected only at the end of the text
            line = context_mark.line
    elif context:
        problem = f"{context}: {problem}"
    if r.secret:  # PyYAML quotes names it found (an alias, an anchor, a tag): not these
        problem = re.sub(r"'[^']*'", "'…'", problem)
    return _text_issue(r, line, f"YAML syntax error: {problem}")


def _text_issue(r: NodeReader, line: int, message: str) -> PolicyIssue:
    """An issue at 0-based `line` of the text `r` reads (a quoted string's: its own line)."""
    if r.inline:
        return PolicyIssue(r.source, r.offset + 1, "yaml",
                           f"{message} (line {line + 1} of the quoted policy.yaml string)")
    return PolicyIssue(r.source, line + 1 + r.offset, "yaml", message)


def configmap_policy(doc: Node) -> Node | None:
    """The value node of data."policy.yaml" when `doc` is a ConfigMap, else None."""
    top = _configmap(doc)
    if top is None:
        return None
    data = top.get("data")
    if not isinstance(data, MappingNode):
        return data if data is not None else doc
    # only this key: the Deployment mounts data."policy.yaml" and nothing else
    return keys_of(data).get("policy.yaml", data)


def holds_policy(doc: Node) -> bool:
    """A ConfigMap with a data."policy.yaml" entry: in a manifest of several documents, the
    policy's (other ConfigMaps may sit beside it)."""
    top = _configmap(doc)
    data = top.get("data") if top is not None else None
    return isinstance(data, MappingNode) and "policy.yaml" in keys_of(data)


def _policy_given_twice(doc: Node) -> tuple[Node, str] | None:
    """The second `data` of a ConfigMap that has two, or its second data."policy.yaml", with
    the field it is."""
    top = _configmap(doc)
    if top is None:
        return None
    assert isinstance(doc, MappingNode)
    datas = [k for k, _ in doc.value if isinstance(k, ScalarNode) and k.value == "data"]
    if len(datas) > 1:
        return datas[1], "data"
    data = top.get("data")
    if not isinstance(data, MappingNode):
        return None
    keys = [k for k, _ in data.value if isinstance(k, ScalarNode) and k.value == "policy.yaml"]
    return (keys[1], 'data."policy.yaml"') if len(keys) > 1 else None


def _configmap(doc: Node) -> dict[str, Node] | None:
    if not isinstance(doc, MappingNode):
        return None
    top = keys_of(doc)
    kind = top.get("kind")
    return top if isinstance(kind, ScalarNode) and kind.value == "ConfigMap" else None


def keys_of(node: MappingNode) -> dict[str, Node]:
    return {k.value: v for k, v in node.value if isinstance(k, ScalarNode)}


def policy_root(text: str, source: str,
                issues: list[PolicyIssue]) -> tuple[Node, str, NodeReader] | None:
    """The policy's root node, its text and a reader with the right line offset."""
    outer = NodeReader(source, 0, issues)
    doc = compose_document(text, outer, "policy")
    if doc is None:
        return None
    value = configmap_policy(doc)
    twice = _policy_given_twice(doc)
    if twice is not None:
        outer.error(twice[0], twice[1], "given twice in the ConfigMap (the first would be "
                    "replaced)")
        return None
    if value is None:
        outer.prepare(doc)
        return doc, text, outer
    if not (isinstance(value, ScalarNode) and value.tag == TAG + "str"):
        outer.error(value, "data.policy.yaml",
                    "a ConfigMap must hold the policy as a string under data.\"policy.yaml\"")
        return None
    if value.style == ">":  # folded: lines at one indentation are joined by a space
        outer.error(value, "data.policy.yaml", "a folded string (>) joins the policy's lines "
                    "into one: write it as a literal block (| or |-)")
        return None
    # A block scalar (|) starts on the line after its indicator, line for line; a quoted
    # string's lines ("queues:\n  - ...", as `kubectl get -o yaml` writes it) are not the
    # file's: its issues name the line it stands on.
    block = value.style == "|"
    inner = NodeReader(source, value.start_mark.line + block, issues, inline=not block)
    root = compose_document(value.value, inner, "policy")
    if root is None:
        return None
    inner.prepare(root)
    return root, value.value, inner



def secrets_file_ref(text: str, source: str = "policy.yaml") -> tuple[str, int] | None:
    """The policy's `secretsFile` value and its line, if it has a readable one. A text
    without the word and without a backslash (a double-quoted key's escapes) has none: the
    policy watcher asks at every change, and composing 5,000 tenants takes over a second."""
    if "secretsFile" not in text and "\\" not in text:
        return None
    found = policy_root(text, source, [])
    if found is None:
        return None
    return secrets_ref(found[0], found[2])


def secrets_ref(root: Node, r: NodeReader) -> tuple[str, int] | None:
    """`secretsFile`'s value and line in a composed policy root, if it has a readable one."""
    if not isinstance(root, MappingNode):
        return None
    for key, value in root.value:
        if (isinstance(key, ScalarNode) and key.value == "secretsFile"
                and isinstance(value, ScalarNode) and value.tag == TAG + "str" and value.value):
            return value.value, r.line(value)
    return None
