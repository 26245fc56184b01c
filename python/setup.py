"""Builds the moe8 Python package from the source tree.

The package carries libmoe8.so (and the MPI module libmoe8_mpi.so when the
build has one), taken from the first of:
  1. $MOE8_LIBRARY (a built libmoe8.so; libmoe8_mpi.so beside it is taken too);
  2. the build tree ../build (after `cmake -S . -B build && cmake --build build`);
  3. a build of its own: cmake configures ../ into python/build/cmake and
     builds the libraries (needs cmake, a C compiler and libcjson-dev;
     `pip install ./python` from a fresh clone does this).
MOE8_CMAKE_ARGS adds options to that cmake configure (-DMOE8_MPI=OFF: no
MPI module).  MOE8_USE_SYSTEM_LIBRARY=1 packages no library: the package then uses an
installed libmoe8 at import time.  The wheel carries a native library, so
it is tagged for this platform, not py3-none-any.

    python3 -m venv .venv && .venv/bin/pip install ./python"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    """A platform wheel: the package holds libmoe8.so."""

    def has_ext_modules(self):
        return True


here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
dest = os.path.join(here, "moe8", "_lib")


def _built(d):
    hits = sorted(glob.glob(os.path.join(d, "libmoe8.so.*.*.*")))
    return hits[0] if hits else None


def _build_own():
    """Configures and builds the library from the source tree; its path or None."""
    if not os.path.exists(os.path.join(root, "CMakeLists.txt")) or not shutil.which("cmake"):
        return None
    bdir = os.path.join(here, "build", "cmake")
    print("moe8: building libmoe8 from %s in %s" % (root, bdir), file=sys.stderr)
    cfg = ["cmake", "-S", root, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF"]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    cfg += os.environ.get("MOE8_CMAKE_ARGS", "").split()  # e.g. -DMOE8_MPI=OFF
    try:
        subprocess.run(cfg, check=True)
        subprocess.run(["cmake", "--build", bdir, "--target", "moe8_python_libs", "-j", str(os.cpu_count() or 1)], check=True)
    except (subprocess.CalledProcessError, OSError) as e:
        sys.exit("moe8: building libmoe8 failed (%s): see the messages above (Debian: apt-get install -y cmake gcc "
                 "pkg-config libcjson-dev)" % e)
    return _built(bdir)


if os.environ.get("MOE8_USE_SYSTEM_LIBRARY") == "1":
    lib = None
else:
    lib = os.environ.get("MOE8_LIBRARY") or _built(os.path.join(root, "build")) or _build_own()
    if not lib or not os.path.exists(lib):
        if not glob.glob(os.path.join(dest, "libmoe8.so*")):
            sys.exit("moe8: no libmoe8.so to package and no source tree to build one from: build it first "
                     "(cmake -S . -B build && cmake --build build), or set MOE8_LIBRARY=path, or "
                     "MOE8_USE_SYSTEM_LIBRARY=1 to use an installed libmoe8")
        lib = None
if lib:
    os.makedirs(dest, exist_ok=True)
    for old in glob.glob(os.path.join(dest, "libmoe8*.so*")):
        os.remove(old)
    shutil.copy2(os.path.realpath(lib), os.path.join(dest, "libmoe8.so"))
    mpi = os.path.join(os.path.dirname(os.path.realpath(lib)), "libmoe8_mpi.so")
    if os.path.exists(mpi):
        shutil.copy2(mpi, os.path.join(dest, "libmoe8_mpi.so"))
lic = os.path.join(root, "LICENSE")
if os.path.exists(lic):
    shutil.copy2(lic, os.path.join(here, "moe8", "LICENSE"))

setup(distclass=BinaryDistribution)
