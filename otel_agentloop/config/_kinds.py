"""How each kind of setting is read, checked and written (:class:`Spec`), and :func:`setting`, which declares one
field of :class:`~._settings.Settings`. Use as ``kind.count(...)``, ``kind.seconds(...)``: each returns the
keyword arguments of a :class:`Spec` but its variable (a :class:`Kind`)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar
from urllib.parse import quote

from ._values import (
    FALSE_TEXT,
    MAX_COUNT,
    MAX_SECONDS,
    TRUE_TEXT,
    AdjustedError,
    check_int,
    check_seconds,
    format_thresholds,
    logger,
    number_text,
    parse_endpoint,
    parse_thresholds,
    positive_number,
    split_pairs,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one :class:`Settings` field is read, validated and written.

    ``parse`` turns environment text into a value (``ValueError`` with the reason when it cannot); ``check``
    validates a ``configure()`` argument (``ValueError`` naming the setting); ``show`` writes a value as text
    that ``parse`` reads back equal. ``env`` is the variable written for other processes; ``read`` lists more
    specific variables read before it (first set and valid wins). ``example`` is a valid non-default value
    (the tests set every setting to it).
    """

    env: str
    parse: Callable[[str], object]
    check: Callable[[str, object], object]
    show: Callable[[Any], str]  # Any: the setting's own value type (int, float, str, a mapping), one per field
    example: object
    read: tuple[str, ...] = ()
    merge: bool = False
    """A mapping whose argument is merged over the environment's (resource attributes), not instead of it."""
    unset: str = "none"
    """What a ``None`` default means, in words (for warnings: "using no OTLP endpoint ...")."""

    def describe(self, value: object) -> str:
        """``value`` as a warning names it: its text, or :attr:`unset` for ``None``."""
        return self.unset if value is None else self.show(value)


class Kind(TypedDict):
    """A kind's half of a :class:`Spec` (what each kind function returns, spread into :func:`setting`)."""

    parse: Callable[[str], object]
    check: Callable[[str, object], object]
    show: Callable[[Any], str]  # Any: as Spec.show
    example: object


def _parse_int(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            as_float = float(raw)
        except ValueError:
            raise ValueError("is not a finite number") from None
        if not math.isfinite(as_float):
            raise ValueError("is not a finite number")
        if not minimum <= as_float <= maximum:  # a count out of range: the default, never a huge bound
            raise ValueError(f"must be between {minimum} and {maximum}")
        return int(as_float)

    return parse


def count(example: int, minimum: int = 0, maximum: int = MAX_COUNT) -> Kind:
    def check(name: str, value: object) -> int:
        return check_int(name, value, minimum, maximum)

    return {
        "parse": _parse_int(minimum, maximum),
        "check": check,
        "show": str,
        "example": example,
    }


def budget(example: int) -> Kind:
    """A count where the environment's ``-1`` means "no limit" (``None``)."""
    parse_int = _parse_int(-1, MAX_COUNT)

    def parse(raw: str) -> int | None:
        value = parse_int(raw)
        return None if value < 0 else value

    def check(name: str, value: object) -> int:
        return check_int(name, value)

    return {
        "parse": parse,
        "check": check,
        "show": str,
        "example": example,
    }


def seconds(example: float, *, millis: bool = False, minimum: float = 0.0, maximum: float = MAX_SECONDS) -> Kind:
    """Seconds > 0, in ``[minimum, maximum]``; ``millis``: the variable holds milliseconds (``OTEL_BSP_*``).
    From the environment, 0, a negative or a non-finite value gives the default; a positive value out of
    range gives the nearest bound (both with a warning)."""
    scale = 1000.0 if millis else 1.0

    def parse(raw: str) -> float:
        return positive_number(raw, minimum=minimum, maximum=maximum, scale=scale)

    def check(name: str, value: object) -> float:
        number = check_seconds(name, value, maximum=maximum)
        if number < minimum:
            raise ValueError(f"{name} must be >= {minimum:g} seconds, not {number:g}")
        return number

    def show(value: float) -> str:
        return number_text(value * scale)

    return {
        "parse": parse,
        "check": check,
        "show": show,
        "example": example,
    }


def _check_bool(name: str, value: object) -> bool:
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be a bool, not {value!r}")


def boolean(example: bool, *, inverted: bool = False) -> Kind:
    """A boolean; ``inverted``: the variable says the opposite (``OTEL_SDK_DISABLED`` for ``enabled``)."""

    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered not in TRUE_TEXT + FALSE_TEXT:
            raise ValueError("is not a boolean")
        return (lowered in TRUE_TEXT) != inverted

    def show(value: bool) -> str:
        return str(bool(value) != inverted).lower()

    return {
        "parse": parse,
        "check": _check_bool,
        "show": show,
        "example": example,
    }


def choice(example: str, choices: tuple[str, ...]) -> Kind:
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"is not one of {', '.join(choices)}")
        return raw.lower()

    def check(name: str, value: object) -> str:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        return str(value)

    return {"parse": parse, "check": check, "show": str, "example": example}


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, not {value!r}")
    return value


def text(example: str) -> Kind:
    return {"parse": str, "check": _check_text, "show": str, "example": example}


def _check_path(name: str, value: object) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path, not {type(value).__name__} {value!r}")
    return os.path.abspath(os.fsdecode(value))


def path(example: str) -> Kind:
    """A file path, made absolute in the process that resolves it (so workers write the driver's file)."""
    return {"parse": os.path.abspath, "check": _check_path, "show": str, "example": example}


def pairs(example: Mapping[str, str], *, headers: bool) -> Kind:
    """A mapping written as ``k=v,...``; headers have lowercased names and string values. Resource attribute
    values that are not strings reach other processes as their ``str()``."""

    def parse(raw: str) -> dict[str, str] | None:
        pairs, malformed = split_pairs(raw, lower=headers)
        if malformed:
            raise AdjustedError(f"has items that are not key=value: {', '.join(map(repr, malformed))}", pairs or None)
        return pairs or None

    def check(name: str, value: object) -> dict[str, object]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"{name} must be a mapping with string keys, not {type(value).__name__}")
        if headers:
            return {k.lower(): str(v) for k, v in value.items()}
        return dict(value)

    def show(value: Mapping[str, object]) -> str:
        # errors="replace": a lone surrogate (os.fsdecode of a non-UTF-8 name) must not stop configure()
        return ",".join(
            f"{quote(str(k), safe='', errors='replace')}={quote(str(v), safe='', errors='replace')}"
            for k, v in value.items()
        )

    return {"parse": parse, "check": check, "show": show, "example": dict(example)}


def thresholds(example: str) -> Kind:
    """Watchdog thresholds, kept as their canonical text (a mapping or text argument is parsed and rewritten)."""

    def canonical(value: Mapping[str, float] | str) -> str | None:
        return format_thresholds(parse_thresholds(value)) or None

    def check(name: str, value: object) -> str | None:
        if not isinstance(value, (str, Mapping)):
            raise ValueError(f"{name} must be a mapping or KEY=SECONDS text, not {type(value).__name__}")
        return canonical(value)

    return {"parse": canonical, "check": check, "show": str, "example": example}


def endpoint(example: str) -> Kind:
    def check(name: str, value: object) -> str:
        given = _check_text(name, value)
        try:
            return parse_endpoint(given)
        except AdjustedError as exc:
            logger.warning("otel_agentloop: %s=%r %s; using %s", name, given, exc, exc.value)
            return str(exc.value)
        except ValueError as exc:
            raise ValueError(f"{name} {given!r} {exc}") from None

    return {"parse": parse_endpoint, "check": check, "show": str, "example": example}


def setting(
    default: T, env: str, *, read: tuple[str, ...] = (), merge: bool = False, unset: str = "none", **kind: Unpack[Kind]
) -> T:
    """One :class:`~._settings.Settings` field: its default and its :class:`Spec` (``kind``: one of this module's
    kinds, ``count(...)``, ``seconds(...)``, ...)."""
    spec = Spec(env=env, read=read, merge=merge, unset=unset, **kind)
    return dataclasses.field(default=default, metadata={"spec": spec})
