"""Builds the moe8 Python package from the source tree, offline.

The package carries libmoe8.so: from $MOE8_LIBRARY, else the build tree
(../build, after `cmake --build build`), copied into moe8/_lib/.  Without
either, the package uses the system's library at import time.

    cmake -S . -B build && cmake --build build
    pip install --no-build-isolation ./python"""
import glob
import os
import shutil

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
lib = os.environ.get("MOE8_LIBRARY") or next(iter(sorted(glob.glob(os.path.join(here, "..", "build", "libmoe8.so.*.*.*")))), None)
dest = os.path.join(here, "moe8", "_lib")
if lib and os.path.exists(lib):
    os.makedirs(dest, exist_ok=True)
    for old in glob.glob(os.path.join(dest, "libmoe8.so*")):
        os.remove(old)
    shutil.copy2(os.path.realpath(lib), os.path.join(dest, "libmoe8.so"))

setup()
