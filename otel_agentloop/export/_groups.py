"""What the two OTLP encoders share: an export batch grouped by resource, then instrumentation scope, as the SDK's
encoder groups it (:class:`Groups`); the encoded attribute keys (:class:`KeyHeads`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

T = TypeVar("T")


class Groups(Generic[T]):
    """Encoded spans grouped by resource, then scope, equal ones together (the SDK's encoder groups them by hash
    and equality), in the order first seen. Objects are compared once per batch, by identity first.
    ``resources``: ``[(resource, [(scope, [span, ...]), ...]), ...]``."""

    def __init__(self) -> None:
        self.resources: list[tuple[Resource | None, list[tuple[InstrumentationScope | None, list[T]]]]] = []
        self._by_id: dict[int, list[tuple[InstrumentationScope | None, list[T]]]] = {}
        self._scope_by_id: dict[tuple[int, int], list[T]] = {}

    def spans_of(self, resource: Resource | None, scope: InstrumentationScope | None) -> list[T]:
        """The list the spans of ``resource`` and ``scope`` go to."""
        key = (id(resource), id(scope))
        spans = self._scope_by_id.get(key)
        if spans is not None:
            return spans
        scopes = self._by_id.get(id(resource))
        if scopes is None:
            for known, known_scopes in self.resources:
                if known == resource:
                    scopes = known_scopes
                    break
            else:
                scopes = []
                self.resources.append((resource, scopes))
            self._by_id[id(resource)] = scopes
        for known_scope, known_spans in scopes:
            if known_scope == scope:
                spans = known_spans
                break
        else:
            spans = []
            scopes.append((scope, spans))
        self._scope_by_id[key] = spans
        return spans


class KeyHeads(dict[object, T]):
    """``heads[key]``: ``encode(key)``, what an encoded attribute starts with, kept for up to ``limit`` string keys
    (an attribute's name is encoded once per process, not once per span). A key that is not a string is encoded
    as ``str(key)`` and not kept."""

    def __init__(self, encode: Callable[[str], T], limit: int = 4096) -> None:
        super().__init__()
        self.encode = encode
        self.limit = limit

    def __missing__(self, key: object) -> T:
        head = self.encode(key if type(key) is str else str(key))
        if type(key) is str and len(self) < self.limit:
            self[key] = head
        return head
