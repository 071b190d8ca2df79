"""Builds agent/datapath/_chainhash (the optional compiled hash chain, agent/datapath/_chainhash.c) in place.

Usage: ``python scripts/build_native.py`` (scripts/bootstrap.sh runs it). Needs a C compiler, the Python headers
and OpenSSL's headers (Debian: gcc, python3-dev, libssl-dev). Exits 1 with the compiler's message when the build
fails; agent/datapath/hashing.py then uses its pure-Python path, which gives the same digests more slowly.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ext = Extension("agent.datapath._chainhash", sources=["agent/datapath/_chainhash.c"], libraries=["crypto"],
                    extra_compile_args=["-O2", "-std=c11", "-Wall"])
    dist = Distribution({"name": "kvpool-native", "ext_modules": [ext], "script_args": ["build_ext", "--inplace",
                                                                                      "--build-temp", "build/native"]})
    dist.parse_command_line()
    try:
        dist.run_commands()
    except Exception as exc:  # setuptools raises CompileError/LinkError (distutils errors) with the compiler's text
        print(f"error: could not build agent.datapath._chainhash ({exc}); block hashing uses the pure-Python path",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    sys.exit(main())
