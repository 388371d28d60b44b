"""The node reader: YAML nodes → typed values, every problem recorded with its line.

Theory of operation: a text is composed (not constructed) with PyYAML's safe loader, so every
value keeps the line it came from (its mark). `NodeReader` converts scalars itself and records a
`PolicyIssue` (source, line, field path, message) for every problem instead of stopping at the
first; `NodeFields` is one mapping's known keys with typed getters that fall back to a default.
An unknown key is an error (with the closest known key suggested), never ignored; a key given
twice in one mapping is an error. The policy's sections (`core/policy/*.py`) and the scenario
loader read their YAML with it.

Durations: a bare number of seconds, or a number with a unit (`150ms`, `8s`, `2m`, `1h`,
compounds such as `1m30s`).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

TAG = "tag:yaml.org,2002:"
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|s|m|h)")
MAX_INTEGER = 2**53  # a count past this is a typo, and a float could not hold it
_EXPONENT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")  # 1e9: YAML 1.1 text, not a number
_UNREADABLE = object()  # a scalar YAML could not construct (its issue is recorded)
_DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class PolicyIssue:
    source: str
    line: int  # 1-based, in the file the user opened
    field: str  # e.g. "queues[1].dropPolicy"
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.field}: {self.message}"


class PolicyError(ValueError):
    """The policy is invalid; `errors` lists every issue found."""

    def __init__(self, errors: list[PolicyIssue]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)




def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def kind_of(node: Node, show_tag: bool = True) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    names = {"null": "null", "bool": "true/false", "int": "an integer", "float": "a number",
             "str": "a string", "timestamp": "a date", "binary": "binary data"}
    return names.get(node.tag.removeprefix(TAG), f"a value tagged {node.tag}" if show_tag
                     else "a value with a tag of its own")


def suggest(key: str, allowed: Sequence[str]) -> str | None:
    camel = re.sub(r"[_-]+([a-zA-Z0-9])", lambda m: m.group(1).upper(), key)
    for name in allowed:
        if name.lower() == camel.lower():
            return name
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return close[0] if close else None


def _bounds(value: float, gt: float | None, ge: float | None, le: float | None,
            lt: float | None) -> str | None:
    lo = f"> {_num(gt)}" if gt is not None else (f">= {_num(ge)}" if ge is not None else None)
    hi = f"<= {_num(le)}" if le is not None else (f"< {_num(lt)}" if lt is not None else None)
    bad = ((gt is not None and not value > gt) or (ge is not None and not value >= ge)
           or (le is not None and not value <= le) or (lt is not None and not value < lt))
    if not bad:
        return None
    rule = " and ".join(r for r in (lo, hi) if r)
    return f"must be {rule}, got {_num(value)}"


def _num(value: float) -> str:
    """An integer in full (1048576, not 1.04858e+06); other numbers short."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


class NodeReader:
    """Converts nodes of one YAML text; lines are shifted by `offset` (ConfigMap embedding)."""

    def __init__(self, source: str, offset: int, issues: list[PolicyIssue], *,
                 inline: bool = False, secret: bool = False) -> None:
        self.source = source
        # `secret`: the text holds secrets (the secrets file): no issue quotes any of it, not
        # even a tag or an alias name (a key pasted as `!sk-…` or `*sk-…`)
        self.secret = secret
        self.offset = offset
        # `inline`: the text is a quoted string on line offset + 1 ("a\nb"), whose lines are
        # not lines of the file: issues name that line and say which line of the string
        self.inline = inline
        self.issues = issues
        self._ctor = SafeConstructor()
        self._own_keys: dict[int, set[int]] = {}

    def line(self, node: Node | None) -> int:
        if self.inline:
            return self.offset + 1
        return (node.start_mark.line if node is not None else 0) + 1 + self.offset

    def error(self, node: Node | None, field: str, message: str) -> None:
        if self.inline:
            inner = (node.start_mark.line if node is not None else 0) + 1
            message += f" (line {inner} of the quoted policy.yaml string)"
        self.issues.append(PolicyIssue(self.source, self.line(node), field, message))

    def type_error(self, node: Node, field: str, expected: str, *, secret: bool = False) -> None:
        secret = secret or self.secret
        hint = ""
        if not secret and expected == "a string" and isinstance(node, ScalarNode):
            hint = f" ({shown(node.value)} was read as {kind_of(node)}; quote it if you meant text)"
        elif (not secret and expected in ("a number", "an integer")
              and isinstance(node, ScalarNode) and node.tag == TAG + "str"
              and _EXPONENT.fullmatch(node.value)):
            hint = (f" (YAML reads {node.value} as text: write the digits)"
                    if expected == "an integer" else
                    f" (YAML reads {node.value} as text: write the exponent with a dot and a "
                    "sign, 1.0e+9, or the digits)")
        self.error(node, field, f"expected {expected}, got {kind_of(node, not secret)}{hint}")

    def _construct(self, node: Node) -> tuple[Any, Exception | None]:
        """The node's value, or the node and why YAML cannot construct it (a date that is no
        date, `!!int ten`, an integer of 5,000 digits)."""
        try:
            return self._ctor.construct_object(node, deep=True), None
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            return node, exc

    def scalar(self, node: Node) -> Any:
        """The node's value, or the node itself when YAML cannot construct it: the caller's
        type check then names what it is."""
        return self._construct(node)[0]

    def _value(self, node: Node, field: str) -> Any:
        """A typed getter's value: `_UNREADABLE` (issue recorded) when YAML cannot construct
        it, so the getter does not also call it the wrong type."""
        if not isinstance(node, ScalarNode):
            return node
        value, exc = self._construct(node)
        if exc is None:
            return value
        # not the value (it may be a long line), nor PyYAML's mark (a line of its own, in the
        # embedded text's numbering)
        reason = (getattr(exc, "problem", None) or str(exc)).split(":")[0].split("\n")[0]
        self.error(node, field, f"cannot be read as {kind_of(node, not self.secret)} ({reason}); "
                   "quote it if you meant text")
        return _UNREADABLE

    def fields(self, node: Node | None, path: str, allowed: Sequence[str], *,
               required: bool = False, free_prefix: str | None = None) -> NodeFields:
        """The known keys of a mapping; an absent or null node reads as empty (or, when
        `required`, as an error). Keys starting with `free_prefix` are the user's own
        (a place for YAML anchors): skipped."""
        entries: dict[str, tuple[Node, Node]] = {}
        if node is None or is_null(node):
            if required and node is not None:
                self.error(node, path, "empty entry; expected a mapping")
            return NodeFields(self, None, path, entries)
        if not isinstance(node, MappingNode):
            self.type_error(node, path or "policy", "a mapping")
            return NodeFields(self, None, path, entries)
        own = self._own_keys.get(id(node)) or {id(k) for k, _ in node.value}
        try:
            self._ctor.flatten_mapping(node)  # merge keys (<<): merged pairs come first
        except yaml.YAMLError as exc:
            self.error(node, path or "policy", f"bad merge key: {exc.problem}")
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not (isinstance(key_node, ScalarNode) and key_node.tag == TAG + "str"):
                self.error(key_node, path or "policy",
                           f"keys must be strings, got {kind_of(key_node, not self.secret)}")
                continue
            key = key_node.value
            field = join(path, key)
            is_own = id(key_node) in own  # a merged-in value may be overridden by its own key
            if is_own and key in seen:
                self.error(key_node, field, "duplicate key (the first value would be replaced)")
            elif free_prefix and key.startswith(free_prefix):
                pass
            elif key not in allowed:
                guess = suggest(key, allowed)
                if guess:
                    self.error(key_node, field,
                               f"unknown key {shown(key)}; did you mean {guess!r}?")
                else:
                    hint = (f" (a key of your own, e.g. to hold a YAML anchor, starts with "
                            f"{free_prefix!r})") if free_prefix else ""
                    self.error(key_node, field, f"unknown key {shown(key)}; allowed here: "
                               f"{', '.join(allowed)}{hint}")
            else:
                entries[key] = (key_node, value_node)
            if is_own:
                seen.add(key)
        return NodeFields(self, node, path, entries)

    def prepare(self, root: Node) -> None:
        """Note each mapping's own keys before any merge key (<<) is resolved: resolving one
        mapping also resolves the mappings it merges from, in place."""
        stack, seen = [root], set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, MappingNode):
                self._own_keys[id(node)] = {id(k) for k, _ in node.value}
                stack.extend(n for pair in node.value for n in pair)
            elif isinstance(node, SequenceNode):
                stack.extend(node.value)

    def seq(self, node: Node, field: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.type_error(node, field, "a list")
            return None
        return list(node.value)

    def integer(self, node: Node, field: str, *, gt: float | None = None,
                ge: float | None = None, le: float | None = None) -> int | None:
        value = self._value(node, field)
        if value is _UNREADABLE:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.type_error(node, field, "an integer")
            return None
        if abs(value) > MAX_INTEGER:
            self.error(node, field, f"too large (at most {MAX_INTEGER:,})")
            return None
        return self._check(node, field, value, gt, ge, le, None)

    def number(self, node: Node, field: str, *, gt: float | None = None, ge: float | None = None,
               le: float | None = None, lt: float | None = None) -> float | None:
        value = self._value(node, field)
        if value is _UNREADABLE:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.type_error(node, field, "a number")
            return None
        number = _finite(value)
        if number is None:
            self.error(node, field, "must be a finite number")
            return None
        return self._check(node, field, number, gt, ge, le, lt)

    def duration(self, node: Node, field: str, *, allow_zero: bool = False) -> float | None:
        value = self._value(node, field)
        if value is _UNREADABLE:
            return None
        seconds: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = _finite(value)
        elif isinstance(value, str):
            seconds = parse_duration(value)
            if seconds is None:
                self.error(node, field, f"bad duration {shown(value)}: use seconds (8, 1.5) or a "
                           "number with a unit: 150ms, 8s, 1.5s, 2m, 1h")
                return None
        else:
            self.type_error(node, field, "a duration (8s, 150ms, 2m or seconds)")
            return None
        if seconds is None or not math.isfinite(seconds):
            self.error(node, field, "must be a finite duration")
            return None
        if allow_zero:
            return self._check(node, field, seconds, None, 0.0, None, None, unit="s")
        return self._check(node, field, seconds, 0.0, None, None, None, unit="s")

    def string(self, node: Node, field: str, *, nonempty: bool = True) -> str | None:
        value = self._value(node, field)
        if value is _UNREADABLE:
            return None
        if not isinstance(value, str):
            self.type_error(node, field, "a string")
            return None
        if nonempty and not value.strip():
            self.error(node, field, "must not be empty")
            return None
        return value

    def boolean(self, node: Node, field: str) -> bool | None:
        value = self._value(node, field)
        if value is _UNREADABLE:
            return None
        if not isinstance(value, bool):
            self.type_error(node, field, "true or false")
            return None
        return value

    def choice(self, node: Node, field: str, allowed: Sequence[str], what: str) -> str | None:
        value = self.string(node, field)
        if value is None:
            return None
        if value not in allowed:
            self.error(node, field, f"unknown {what} {shown(value)}; allowed: {', '.join(allowed)}")
            return None
        return value

    def _check(self, node: Node, field: str, value: Any, gt: float | None, ge: float | None,
               le: float | None, lt: float | None, unit: str = "") -> Any:
        problem = _bounds(value, gt, ge, le, lt)
        if problem:
            self.error(node, field, problem + unit)
            return None
        return value


def _finite(value: float) -> float | None:
    """float(value), None when it is not finite (an integer of 400 digits overflows)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == TAG + "null"


def parse_duration(text: str) -> float | None:
    """Seconds from "8", "1.5", "150ms", "8s", "2m", "1h", "1m30s" (sign allowed); None if
    the text is not a duration."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    try:
        return sign * float(s)  # "8" or "1.5" written as a string
    except ValueError:
        pass
    if not s or _DURATION_PART.sub("", s):
        return None
    return sign * sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(s))


@dataclass
class NodeFields:
    """The known keys of one mapping, with typed getters that fall back to a default."""

    r: NodeReader
    node: Node | None
    path: str
    entries: dict[str, tuple[Node, Node]]

    def field(self, key: str) -> str:
        return join(self.path, key)

    def get(self, key: str) -> Node | None:
        """The value node, or None when absent or null."""
        entry = self.entries.get(key)
        if entry is None or is_null(entry[1]):
            return None
        return entry[1]

    def key_node(self, key: str) -> Node | None:
        entry = self.entries.get(key)
        return entry[0] if entry is not None else self.node

    def has(self, key: str) -> bool:
        return key in self.entries

    def require(self, key: str) -> Node | None:
        node = self.get(key)
        if node is None:
            where = self.entries[key][1] if key in self.entries else self.node
            self.r.error(where, self.field(key), "missing (required)")
        return node

    def integer(self, key: str, default: int, **bounds: float) -> int:
        node = self.get(key)
        value = None if node is None else self.r.integer(node, self.field(key), **bounds)
        return default if value is None else value

    def number(self, key: str, default: float, **bounds: float) -> float:
        node = self.get(key)
        value = None if node is None else self.r.number(node, self.field(key), **bounds)
        return default if value is None else value

    def duration(self, key: str, default: float, *, allow_zero: bool = False) -> float:
        node = self.get(key)
        value = (None if node is None
                 else self.r.duration(node, self.field(key), allow_zero=allow_zero))
        return default if value is None else value

    def string(self, key: str, default: str, *, nonempty: bool = True) -> str:
        node = self.get(key)
        value = (None if node is None
                 else self.r.string(node, self.field(key), nonempty=nonempty))
        return default if value is None else value

    def boolean(self, key: str, default: bool) -> bool:
        node = self.get(key)
        value = None if node is None else self.r.boolean(node, self.field(key))
        return default if value is None else value

    def unique_name(self, seen: dict[str, str], what: str, *, say_where: bool = True) -> str | None:
        """The required `name` of a list entry; one already in `seen` (name → the path of the
        entry that has it) is an error, naming that entry when `say_where`."""
        node = self.require("name")
        name = None if node is None else self.r.string(node, self.field("name"))
        if name is not None:
            check_header_safe(self.r, node, self.field("name"), f"{what} name", name)
        if name is not None and name in seen:
            where = f" (already used by {seen[name]})" if say_where else ""
            self.r.error(node, self.field("name"), f"duplicate {what} name {shown(name)}{where}")
        elif name is not None:
            seen[name] = self.path
        return name

    def sub(self, key: str, allowed: Sequence[str]) -> NodeFields:
        return self.r.fields(self.get(key), self.field(key), allowed)




def sort_issues(issues: list[PolicyIssue], source: str) -> list[PolicyIssue]:
    """The main file's issues first, by line; then those of other files (secrets)."""
    return sorted(issues, key=lambda i: (i.source != source, i.line))


def check_header_safe(r: NodeReader, node: Node | None, field: str, what: str,
                      value: str) -> bool:
    """Names go into HTTP headers (x-llmvalve-tenant, -class, -pool, -rewrite-model) and
    metric labels: a character Latin-1 cannot write, or a line break, would break the answer
    to Envoy. False (and an issue) where `value` has one."""
    if value.isascii() and value.isprintable():
        return True
    r.error(node, field, f"{what} {shown(value)} must be printable ASCII (it is written into "
            "HTTP headers)")
    return False


def read_names(f: NodeFields, key: str, what: str) -> tuple[str, ...]:
    """An optional list of distinct non-empty strings (model names)."""
    node = f.get(key)
    if node is None:
        return ()
    out: list[str] = []
    for j, item in enumerate(f.r.seq(node, f.field(key)) or []):
        value = f.r.string(item, join(f.field(key), j))
        if value is None:
            continue
        if value in out:
            f.r.error(item, join(f.field(key), j), f"duplicate {what} {shown(value)}")
        else:
            check_header_safe(f.r, item, join(f.field(key), j), what, value)
        out.append(value)
    return tuple(out)


def duration_at_least(f: NodeFields, key: str, default: float, floor_s: float, why: str) -> float:
    """A duration with a floor below which it is a typo (500us for 500ms)."""
    value = f.duration(key, default)
    if value < floor_s:
        f.r.error(f.get(key), f.field(key), f"at least {floor_s:g}s ({why})")
        return default
    return value


def shown(value: object, limit: int = 60) -> str:
    """A value as an error quotes it: its repr, cut to `limit` characters (a 100 KB line
    quoted whole is not an error message)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
