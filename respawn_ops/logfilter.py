"""Evaluate Cloud Logging queries against LogEntry dicts: the subset the sink filter uses.

The sink filter has one source, ``respawn/sink_filter.txt``: Terraform hands it to
the log sink with ``file()``, and the local log router and the tests evaluate it
here, so the two cannot drift.

Supported, with Cloud Logging's meaning:

* ``AND``, ``OR``, ``NOT``, parentheses, and juxtaposition as an implicit AND.
  Precedence as in Cloud Logging: NOT binds tightest, then OR, then AND, so
  ``a OR b AND c`` is ``(a OR b) AND c``.
* ``FIELD OP VALUE`` with dotted field paths (``protoPayload.methodName``),
  values quoted (``"..."``, with ``\\"`` and ``\\\\`` escapes) or bare (``ERROR``).
  A field holding a list matches when any element matches (repeated fields).
* ``=`` / ``!=``: equality, case-insensitive. ``:``: has, a case-insensitive
  substring test on the field or anything nested in it. ``=~`` / ``!~``: regular
  expression search, case-sensitive (``(?i)`` for insensitive). A missing field
  never satisfies ``=``, ``:`` or ``=~``; ``!=`` and ``!~`` are their negations.
* Value lists: ``FIELD OP ("a" OR "b")`` means ``FIELD OP "a" OR FIELD OP "b"``.

Anything else (comparisons ``<``/``>``, global restrictions, functions such as
``log_id()``, ``-`` negation, ``--`` comments) is rejected with a clear error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

SINK_FILTER: Traversable = resources.files("respawn_ops") / "sink_filter.txt"

_OPERATORS = ("=~", "!~", "!=", "<=", ">=", "=", ":", "<", ">")
_SUPPORTED_OPERATORS = ("=", "!=", ":", "=~", "!~")
_KEYWORDS = ("AND", "OR", "NOT")
_WORD_END = set(' \t\r\n()"=!:<>~')


def load_sink_filter() -> str:
    """The sink filter's text, read from the package (the file Terraform reads too)."""
    return SINK_FILTER.read_text(encoding="utf-8")


def sink_filter() -> LogFilter:
    """The parsed sink filter."""
    return LogFilter.parse(load_sink_filter())


class FilterSyntaxError(ValueError):
    """The query uses syntax this evaluator does not support, or is malformed."""

    def __init__(self, text: str, pos: int, problem: str) -> None:
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        super().__init__(f"log filter, line {line} column {column}: {problem}")
        self.line = line
        self.column = column
        self.problem = problem


@dataclass(frozen=True)
class _Token:
    kind: str  # "(" ")" op string word keyword end
    value: str
    pos: int


def _tokens(text: str) -> Iterator[_Token]:
    i, n = 0, len(text)
    after_op = False
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c in "()":
            token, end = _Token(c, c, i), i + 1
        elif c == '"':
            value, end = _quoted(text, i)
            token = _Token("string", value, i)
        elif c == "-" and not after_op:
            if text.startswith("--", i):
                problem = "comments ('--') are not supported in the filter file; keep notes in docs/deploy.md"
            else:
                problem = "the '-' negation shorthand is not supported; use NOT"
            raise FilterSyntaxError(text, i, problem)
        elif op := next((o for o in _OPERATORS if text.startswith(o, i)), None):
            token, end = _Token("op", op, i), i + len(op)
        elif c in _WORD_END:
            raise FilterSyntaxError(text, i, f"unexpected character {c!r}")
        else:
            end = i
            while end < n and text[end] not in _WORD_END:
                end += 1
            word = text[i:end]
            token = _Token("keyword" if word in _KEYWORDS else "word", word, i)
        yield token
        after_op = token.kind == "op"
        i = end
    yield _Token("end", "", n)


def _quoted(text: str, start: int) -> tuple[str, int]:
    out: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append(nxt if nxt in '"\\' else c + nxt)
            i += 2
            continue
        out.append(c)
        i += 1
    raise FilterSyntaxError(text, start, "unterminated quoted string")


# --- the syntax tree -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _And:
    items: tuple[_Node, ...]

    def matches(self, entry: Mapping[str, Any]) -> bool:
        return all(item.matches(entry) for item in self.items)


@dataclass(frozen=True)
class _Or:
    items: tuple[_Node, ...]

    def matches(self, entry: Mapping[str, Any]) -> bool:
        return any(item.matches(entry) for item in self.items)


@dataclass(frozen=True)
class _Not:
    item: _Node

    def matches(self, entry: Mapping[str, Any]) -> bool:
        return not self.item.matches(entry)


@dataclass(frozen=True)
class _Compare:
    path: tuple[str, ...]
    op: str
    value: str
    pattern: re.Pattern[str] | None = None

    def matches(self, entry: Mapping[str, Any]) -> bool:
        values = _resolve(entry, self.path)
        if self.op == "=":
            return any(_text(v) == self.value.casefold() for v in values if _scalar(v))
        if self.op == "!=":
            return not any(_text(v) == self.value.casefold() for v in values if _scalar(v))
        if self.op == ":":
            needle = self.value.casefold()
            return any(needle in _text(leaf) for v in values for leaf in _leaves(v))
        assert self.pattern is not None
        found = any(self.pattern.search(_raw(v)) for v in values if _scalar(v))
        return found if self.op == "=~" else not found


_Node = _And | _Or | _Not | _Compare


def _resolve(value: Any, path: tuple[str, ...]) -> list[Any]:
    """Every value at `path` (lists fan out, as repeated fields do in Cloud Logging)."""
    if isinstance(value, list):
        return [found for item in value for found in _resolve(item, path)]
    if not path:
        return [value]
    if isinstance(value, Mapping) and path[0] in value:
        return _resolve(value[path[0]], path[1:])
    return []


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif value is not None:
        yield value


def _scalar(value: Any) -> bool:
    return value is not None and not isinstance(value, Mapping | list)


def _raw(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _text(value: Any) -> str:
    return _raw(value).casefold()


# --- the parser ------------------------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(_tokens(text))
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def fail(self, token: _Token, problem: str) -> FilterSyntaxError:
        return FilterSyntaxError(self.text, token.pos, problem)

    def expected(self, what: str, token: _Token) -> FilterSyntaxError:
        found = "the end of the filter" if token.kind == "end" else repr(token.value)
        return self.fail(token, f"expected {what}, found {found}")

    def query(self) -> _Node:
        if self.peek().kind == "end":
            raise self.fail(self.peek(), "the filter is empty")
        node = self.conjunction()
        if self.peek().kind != "end":
            raise self.fail(self.peek(), f"unexpected {self.peek().value!r}")
        return node

    def conjunction(self) -> _Node:
        items = [self.disjunction()]
        while True:
            token = self.peek()
            if token.kind == "keyword" and token.value == "AND":
                self.take()
            elif token.kind in ("end", ")"):
                break
            items.append(self.disjunction())  # AND, or juxtaposition (an implicit AND)
        return items[0] if len(items) == 1 else _And(tuple(items))

    def disjunction(self) -> _Node:
        items = [self.unary()]
        while self.peek().kind == "keyword" and self.peek().value == "OR":
            self.take()
            items.append(self.unary())
        return items[0] if len(items) == 1 else _Or(tuple(items))

    def unary(self) -> _Node:
        token = self.peek()
        if token.kind == "keyword" and token.value == "NOT":
            self.take()
            return _Not(self.unary())
        return self.primary()

    def primary(self) -> _Node:
        token = self.take()
        if token.kind == "(":
            node = self.conjunction()
            if self.take().kind != ")":
                raise self.fail(token, "this '(' is never closed")
            return node
        if token.kind == "string":
            raise self.fail(token, "global restrictions (a value without a field) are not supported; use FIELD:VALUE")
        if token.kind != "word":
            raise self.expected("a comparison FIELD OP VALUE", token)
        return self.comparison(token)

    def comparison(self, field: _Token) -> _Node:
        if field.value.upper() in _KEYWORDS:
            raise self.fail(field, f"write the operator {field.value!r} in capitals: AND, OR, NOT")
        path = tuple(field.value.split("."))
        if not all(path):
            raise self.fail(
                field, f"field path {field.value!r} has an empty segment (quoted segments are not supported)"
            )
        op = self.take()
        if op.kind == "(":
            raise self.fail(field, f"functions such as {field.value}() are not supported")
        if op.kind != "op":
            raise self.fail(
                op, f"expected an operator after {field.value!r}; supported: {' '.join(_SUPPORTED_OPERATORS)}"
            )
        if op.value not in _SUPPORTED_OPERATORS:
            raise self.fail(op, f"operator {op.value!r} is not supported; supported: {' '.join(_SUPPORTED_OPERATORS)}")
        values = self.values()
        compares = [self.compare(path, op, value) for value in values]
        return compares[0] if len(compares) == 1 else _Or(tuple(compares))

    def values(self) -> list[_Token]:
        token = self.take()
        if token.kind in ("string", "word"):
            return [token]
        if token.kind != "(":
            raise self.expected("a value", token)
        values = [self.value()]
        while self.peek().kind == "keyword":
            keyword = self.take()
            if keyword.value != "OR":
                raise self.fail(keyword, f"only OR is supported inside a value list, found {keyword.value}")
            values.append(self.value())
        if self.take().kind != ")":
            raise self.fail(token, "this value list is never closed")
        return values

    def value(self) -> _Token:
        token = self.take()
        if token.kind not in ("string", "word"):
            raise self.expected("a value", token)
        return token

    def compare(self, path: tuple[str, ...], op: _Token, value: _Token) -> _Compare:
        if op.value not in ("=~", "!~"):
            return _Compare(path, op.value, value.value)
        try:
            return _Compare(path, op.value, value.value, re.compile(value.value))
        except re.error as e:
            raise self.fail(value, f"invalid regular expression {value.value!r}: {e}") from None


@dataclass(frozen=True)
class LogFilter:
    """A parsed Cloud Logging query. ``LogFilter.parse(text).matches(entry)``."""

    text: str
    root: _Node

    @classmethod
    def parse(cls, text: str) -> LogFilter:
        """Parse `text`; raises FilterSyntaxError naming the line, column and problem."""
        return cls(text, _Parser(text).query())

    def matches(self, entry: Mapping[str, Any]) -> bool:
        """Whether Cloud Logging would route `entry` (a LogEntry as JSON) through this filter."""
        return self.root.matches(entry)
