"""A self-signed certificate and key made with ``openssl`` in a test's temp dir."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def self_signed(directory: Path, name: str, cn: str, san: str | None = None) -> tuple[str, str]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    extra = ["-addext", f"subjectAltName={san}"] if san else []
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={cn}", *extra,
    )  # fmt: skip
    return str(cert), str(key)
