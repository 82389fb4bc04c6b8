"""What the self-contained pages (step timeline, run page, compare) share: their head, inline data, Jaeger links,
and writing the file."""

from __future__ import annotations

import html
import json
import os
import urllib.parse

HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%TITLE%</title>
<style>%CSS%</style></head>
"""
"""A page's head; :func:`fill` puts in its title and style."""


def fill(template: str, *, title: str, css: str, js: str, data: object) -> str:
    """``template`` (starting with :data:`HEAD`) with its title (escaped), style, script and inline data."""
    return (
        template.replace("%TITLE%", html.escape(f"otel-agentloop: {title}"))
        .replace("%CSS%", css)
        .replace("%JS%", js)
        .replace("%DATA%", script_json(data))
    )


def script_json(data: object) -> str:
    """JSON safe inside a ``<script>`` element: no ``</script>``, ``<!--`` or entity can form."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def jaeger_ui_base(url: str | None) -> str | None:
    """``url`` without a trailing slash when it is an http(s) URL, else ``None`` (no link is made)."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def write_page(path: str | os.PathLike[str], text: str) -> str:
    """Write ``text`` to ``path`` (UTF-8); returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)
