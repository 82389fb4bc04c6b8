"""What every ``report`` path shares: a failure the user can act on (:class:`CliError`), the notes on stderr, and
writing an output file."""

from __future__ import annotations

from collections.abc import Callable

from ..analysis._reading._text import printable
from ..analysis._rendering._terminal import say


class CliError(Exception):
    """A failure the user can act on: printed as one line on stderr (``report: ...``), exit 1."""


def fail(what: str, path: str, exc: OSError) -> CliError:
    reason = exc.strerror or type(exc).__name__
    return CliError(f"{what} {printable(path)}: {printable(reason)}")


def note(line: str) -> None:
    say(f"report: {printable(line, max_chars=1000)}", err=True)


def write(what: str, path: str, render: Callable[[], str]) -> str:
    try:
        return render()
    except OSError as exc:  # a missing folder, no permission, a directory
        raise fail(f"cannot write {what}", path, exc) from None
