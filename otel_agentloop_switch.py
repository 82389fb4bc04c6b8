"""The startup hook's switch, ``OTEL_AGENTLOOP_STARTUP_HOOK``: what turns it off or leaves it on.

A leaf module (it imports nothing), read by both ``otel_agentloop_startup`` at interpreter start, which must not
import the package, and ``otel_agentloop.config._environment``, which declares and checks the variable with it.
"""

from __future__ import annotations

OPT_OUT = "OTEL_AGENTLOOP_STARTUP_HOOK"
OFF = ("false", "0", "off", "no", "disable", "disabled", "none")
"""What :data:`OPT_OUT` may say (any case, spaces around) to turn the startup hook off."""
ON = ("true", "1", "on", "yes", "enable", "enabled")
"""What :data:`OPT_OUT` may say to leave it on (as unset or empty does)."""
WHAT = (
    "the startup hook (it wraps ray.init in a driver whose command line names our Ray setup hook, "
    "so that the driver's settings reach every Ray worker)"
)


def switch(raw: str | None) -> bool | None:
    """Whether :data:`OPT_OUT`'s text ``raw`` leaves the startup hook on (unset or empty: on); ``None`` for a
    value that is neither :data:`ON` nor :data:`OFF` (then the hook is off: the variable exists to turn it
    off, so a user who set it to anything is not overruled)."""
    text = (raw or "").strip().lower()
    if not text or text in ON:
        return True
    return False if text in OFF else None


def reason() -> str:
    """Why an :data:`OPT_OUT` value is not recognised, and what it does (``config`` warns with it too)."""
    return f"is not one of {', '.join(OFF)} (off) nor {', '.join(ON)} (on); it switches {WHAT}, now off"
