"""Builds the moe8 Python package from the source tree, offline.

The package carries libmoe8.so: from $MOE8_LIBRARY, else the build tree
(../build, after `cmake --build build`), copied into moe8/_lib/.  Without
either the build stops with a message, unless MOE8_USE_SYSTEM_LIBRARY=1
says to use an installed libmoe8 at import time.  The wheel carries a
native library, so it is tagged for this platform, not py3-none-any.

    cmake -S . -B build && cmake --build build
    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation ./python"""
import glob
import os
import shutil
import sys

from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    """A platform wheel: the package holds libmoe8.so."""

    def has_ext_modules(self):
        return True


here = os.path.dirname(os.path.abspath(__file__))
lib = os.environ.get("MOE8_LIBRARY") or next(iter(sorted(glob.glob(os.path.join(here, "..", "build", "libmoe8.so.*.*.*")))), None)
dest = os.path.join(here, "moe8", "_lib")
if lib and os.path.exists(lib):
    os.makedirs(dest, exist_ok=True)
    for old in glob.glob(os.path.join(dest, "libmoe8.so*")):
        os.remove(old)
    shutil.copy2(os.path.realpath(lib), os.path.join(dest, "libmoe8.so"))
elif not glob.glob(os.path.join(dest, "libmoe8.so*")) and os.environ.get("MOE8_USE_SYSTEM_LIBRARY") != "1":
    sys.exit("moe8: no libmoe8.so to package: build it first (cmake -S . -B build && cmake --build build), or set MOE8_LIBRARY=path, "
             "or MOE8_USE_SYSTEM_LIBRARY=1 to use an installed libmoe8")

setup(distclass=BinaryDistribution)
