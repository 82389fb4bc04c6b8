"""prime-rl's env server for the tests: verifiers' own ``serve_env`` (one in-process ``EnvServer``) serving the
``vf_tools_env`` env (:data:`eval_driver.ENV`) on an OS-assigned loopback port, whose address it writes to
``argv[1]``. No tracing code here: the test runs it under ``opentelemetry-instrument``. SIGTERM ends it cleanly
(verifiers arms it to), so its spans are flushed at exit."""

from __future__ import annotations

import sys
from pathlib import Path

from eval_driver import ENV


class AddressFile:
    """``serve_env``'s ``address_queue``: the bound address, written whole (tmp then rename)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def put(self, address: str) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(address)
        tmp.replace(self.path)


if __name__ == "__main__":
    from verifiers.v1.serve import serve_env

    serve_env(max_workers=1, address="tcp://127.0.0.1:0", address_queue=AddressFile(sys.argv[1]), config_data=ENV)
