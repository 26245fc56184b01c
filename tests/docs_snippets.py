#!/usr/bin/env python3
"""Runs the Python code blocks of README.md and docs/*.md as written.

usage: docs_snippets.py SOURCE_DIR MOE8_BIN MOE8_LIBRARY

Every fenced ```python block runs in a fresh interpreter, in a temporary
directory that holds a link to the repository's examples/, with the
package from python/, the built library (MOE8_LIBRARY) and the moe8
command on PATH.  A block that imports a module this machine lacks
(transformers is not a Debian package; torch may be absent) is skipped
with a notice naming the module.  The other blocks of the docs (shell
commands that install, build or start MPI jobs; C fragments of a larger
program; signatures) are not programs: they are counted and named, not
run.  The last line says how many passed, failed and were skipped.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile


def blocks(path):
    """(line, language, text) of each fenced block of a markdown file."""
    out, lang, start, buf = [], None, 0, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r"^```\s*([A-Za-z0-9_+-]*)\s*$", line.rstrip("\n"))
            if m and lang is None:
                lang, start, buf = m.group(1) or "text", n, []
            elif m and lang is not None and not m.group(1):
                out.append((start, lang, "".join(buf)))
                lang = None
            elif lang is not None:
                buf.append(line)
    return out


def needs(code):
    """The modules a block imports that are not installed here."""
    mods = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_][A-Za-z0-9_]*)", code, re.M))
    return sorted(m for m in mods if m != "moe8" and importlib.util.find_spec(m) is None)


def main():
    src, moe8_bin, lib = (os.path.abspath(a) for a in sys.argv[1:4])
    files = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
    env = dict(os.environ, MOE8_LIBRARY=lib, PYTHONPATH=os.path.join(src, "python"), PYTHONDONTWRITEBYTECODE="1",
               PATH=os.path.dirname(moe8_bin) + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="2")
    passed = failed = skipped = 0
    other = {}
    for path in files:
        rel = os.path.relpath(path, src)
        for line, lang, code in blocks(path):
            where = "%s:%d" % (rel, line)
            if lang != "python":
                other.setdefault(lang, []).append(where)
                continue
            missing = needs(code)
            if missing:
                print("skipped %s: needs %s (not installed here)" % (where, ", ".join(missing)))
                skipped += 1
                continue
            with tempfile.TemporaryDirectory() as tmp:
                os.symlink(os.path.join(src, "examples"), os.path.join(tmp, "examples"))
                r = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode == 0:
                print("passed  %s" % where)
                passed += 1
            else:
                print("FAILED  %s (exit %d):\n%s%s" % (where, r.returncode, r.stdout, r.stderr))
                failed += 1
    for lang, places in sorted(other.items()):
        print("not run: %d %s block(s), not programs (%s)" % (len(places), lang, ", ".join(places)))
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
