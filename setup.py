"""Build steps pyproject.toml cannot declare (all metadata is in pyproject.toml).

* ``agent.datapath._chainhash``, the compiled block-hash chain, is optional: built when a C compiler and OpenSSL's
  headers are there (Debian: gcc, python3-dev, libssl-dev; libxxhash-dev adds XXH3), skipped with a warning
  otherwise -- ``agent/datapath/hashing.py`` then uses its pure-Python path (same digests, slower). In a checkout,
  ``python scripts/build_native.py`` builds it in place.
* The dashboard's templates live in the checkout's top-level ``templates/`` (``settings.TEMPLATES["DIRS"]``); a
  wheel carries them as ``dashboard/templates/``, where Django's app-directories loader finds them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns instead of failing: the extension only makes block hashing faster."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (distutils' CCompilerError/PlatformError)
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError/LinkError: missing headers or libcrypto
            self._skipped(exc)

    @staticmethod
    def _skipped(exc: Exception) -> None:
        print(f"warning: agent.datapath._chainhash not built ({exc}); block hashing runs in pure Python "
              "(same digests, slower)", file=sys.stderr)


class BuildPyWithTemplates(build_py):
    """``build_py`` that also copies the top-level ``templates/`` into the built ``dashboard`` package."""

    def run(self) -> None:
        super().run()
        source = ROOT / "templates"
        if getattr(self, "editable_mode", False) or not source.is_dir():
            return  # an editable install reads templates/ from the checkout, like `manage.py runserver`
        target = Path(self.build_lib) / "dashboard" / "templates"
        for path in sorted(source.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                dest = target / path.relative_to(source)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)


setup(
    ext_modules=[
        Extension("agent.datapath._chainhash", sources=["agent/datapath/_chainhash.c"], libraries=["crypto"],
                  extra_compile_args=["-O2", "-std=c11", "-Wall"], optional=True),
    ],
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithTemplates},
)
