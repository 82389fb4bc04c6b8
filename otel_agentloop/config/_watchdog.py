"""The watchdog's settings as one object (:class:`WatchdogSettings`): a view of the ``watchdog_*`` fields of
:class:`~._settings.Settings`, which declare each one (variable, default, range) once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ._settings import SPECS, Settings, resolve
from ._values import ThresholdKey, parse_thresholds

PREFIX = "watchdog_"
WATCHDOG_FIELDS: tuple[str, ...] = tuple(name.removeprefix(PREFIX) for name, _, _ in SPECS if name.startswith(PREFIX))
"""The watchdog settings, as :class:`WatchdogSettings` names them: the declaration's ``watchdog_*`` fields."""


@dataclass(frozen=True)
class WatchdogSettings:
    """How the watchdog decides a phase runs too long (see ``health._watchdog``). Seconds throughout.

    Each field is the declaration's ``watchdog_<field>`` (``config._settings.Settings``): its default, its
    check (a bad value raises ``ValueError`` naming ``watchdog_<field>``) and its variable
    (``OTEL_AGENTLOOP_WATCHDOG``, ``_INTERVAL``, ``_THRESHOLDS`` such as ``tool_calls=60,tool:python=300``,
    ``_P99_MULTIPLE``, ``_MIN``, ``_DEFAULT``, ``_MIN_OBSERVATIONS``, ``_WINDOW``, ``_MAX_WARNINGS``; read by
    :meth:`from_env`). A test keeps these fields and the declaration's the same.
    """

    enabled: bool = Settings.watchdog_enabled
    interval_s: float = Settings.watchdog_interval_s
    thresholds_s: Mapping[str, float] | str | None = Settings.watchdog_thresholds_s
    p99_multiple: float = Settings.watchdog_p99_multiple
    min_s: float = Settings.watchdog_min_s
    default_s: float = Settings.watchdog_default_s
    min_observations: int = Settings.watchdog_min_observations
    window: int = Settings.watchdog_window
    max_warnings_per_check: int = Settings.watchdog_max_warnings_per_check
    parsed: dict[ThresholdKey, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        resolve(self.arguments(), environ={}, only=self.arguments())  # the declaration's checks
        object.__setattr__(self, "parsed", parse_thresholds(self.thresholds_s))

    @classmethod
    def from_env(cls, **overrides: object) -> WatchdogSettings:
        """Settings from ``OTEL_AGENTLOOP_WATCHDOG*``, then ``overrides`` (a bad variable warns, keeps the default)."""
        arguments = {PREFIX + name: value for name, value in overrides.items()}
        return cls.from_settings(resolve(arguments, only=[PREFIX + name for name in WATCHDOG_FIELDS]))

    @classmethod
    def from_settings(cls, settings: Settings) -> WatchdogSettings:
        """The watchdog part (``watchdog_*`` fields) of resolved :class:`~._settings.Settings`."""
        return cls(**{name: getattr(settings, PREFIX + name) for name in WATCHDOG_FIELDS})

    def arguments(self) -> dict[str, object]:
        """These settings as ``Settings`` arguments (``watchdog_*`` field name -> value)."""
        return {PREFIX + name: getattr(self, name) for name in WATCHDOG_FIELDS}

    def worker_env(self) -> dict[str, str]:
        """Environment that gives another process's ``configure()`` these settings."""
        return resolve(self.arguments(), environ={}).worker_env()


def watchdog_arguments(watchdog: WatchdogSettings | bool | None) -> dict[str, object]:
    """``configure(watchdog=...)`` as ``Settings`` arguments: a :class:`WatchdogSettings` sets every
    ``watchdog_*`` setting, ``True``/``False`` only ``watchdog_enabled``, ``None`` none."""
    if isinstance(watchdog, WatchdogSettings):
        return watchdog.arguments()
    return {} if watchdog is None else {PREFIX + "enabled": bool(watchdog)}
