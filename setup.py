"""Everything is in pyproject.toml except one file: ``otel_agentloop_startup.pth`` goes to the root of
site-packages (the wheel's root; for an editable install, the root of the editable wheel), so that the
setup-hook flag alone is the one switch (see ``otel_agentloop_startup.py``). ``pip uninstall`` removes it
(it is in the wheel's RECORD)."""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "otel_agentloop_startup.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH)
        # editable_wheel points the install command at its unpacked wheel, which it zips as it is
        target = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(source, os.path.join(target, PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
