"""Every Python and shell example of README.md and docs/*.md runs as written (docs/testing.md,
"Documentation examples"); the C++ ones are compiled and run by ctest (docs.cpp_core, docs.cpp_torch).
Also: every project path the docs name exists.

Python blocks run in a fresh interpreter after tests/docs/prelude.py (a small model, a loader, a
loss, an optimizer); shell blocks run under bash -e with .venv/bin first on PATH, as a user with the
venv activated would. Both run in a temporary folder that links the checkout's build, .venv and sources,
so relative paths work and outputs stay out of the checkout."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import doc_blocks  # noqa: E402

BLOCKS = [b for b in doc_blocks.blocks() if b.lang in ("python", "bash")]


# What examples read through relative paths. Not the scripts or CMakeLists: a script run from a
# linked folder would configure and build the checkout under that folder's name.
_LINKED = (".venv", "build", "tools", "tests", "python", "docs", "examples")


@pytest.fixture
def workdir(tmp_path):
    for name in _LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _run(argv, cwd, what, timeout=600):
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{what} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_example_runs(block, workdir):
    if block.skip:
        pytest.skip(block.skip)
    if block.lang == "python":
        prelude = (ROOT / "tests" / "docs" / "prelude.py").read_text()
        # Errors point at the block's lines in its document.
        source = prelude + "\n" * max(0, block.line - prelude.count("\n")) + block.code
        script = workdir / "example.py"
        script.write_text(source)
        _run([sys.executable, str(script)], workdir, block.name)
    else:
        script = "\n".join(["set -euo pipefail", *block.setup, block.code])
        _run(["bash", "-c", script], workdir, block.name)


# Paths into the project that the docs name, e.g. `docs/train.md`, python/fusedopt/_base.py, and
# bare names of our docs (trainer.md); shared/ is the team's reference folder, not part of the project.
_PATH = re.compile(r"(?<![\w./-])((?:docs|src|include|tools|tests|bench|python|scripts|examples|reference|cmake|shared)"
                   r"/[\w./-]*[\w/])(\.\{[\w,]+\})?(?![<\w])")  # src/doctor/doctor.{h,cc}; not prelude_<kind>.h
_DOC_NAME = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")


def _mentions(text: str):
    for m in _PATH.finditer(text):
        if m.group(2):  # brace list: one path per alternative
            yield from (f"{m.group(1)}.{ext}" for ext in m.group(2)[2:-1].split(","))
        else:
            yield m.group(1)
    for m in _DOC_NAME.finditer(text):
        yield m.group(1)


def _exists(ref: str, doc: pathlib.Path) -> bool:
    if ref.startswith("shared/"):
        return False
    if "/" in ref:
        return (ROOT / ref).exists() or (doc.parent / ref).exists()
    return (ROOT / ref).exists() or (ROOT / "docs" / ref).exists()


# Files whose prose names project paths: the docs, and the comments that send readers to them.
_REFERRING = [*doc_blocks.doc_files(), ROOT / "tests" / "CMakeLists.txt", ROOT / "tests" / "torch" / "CMakeLists.txt"]


@pytest.mark.parametrize("doc", _REFERRING, ids=[str(p.relative_to(ROOT)) for p in _REFERRING])
def test_named_paths_exist(doc):
    missing = sorted({ref for ref in _mentions(doc.read_text()) if not _exists(ref, doc)})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"
