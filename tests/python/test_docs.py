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
import unicodedata

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


# A gloo rank that aborts as its process exits, after the example's destroy_process_group() and all its output
# (torch 2.13's gloo teardown; pytorch/pytorch#179291 describes gloo's threads releasing tensors during interpreter
# finalization). It happens in about one run of the torchrun examples in tens, and came twice in a row once on a
# loaded machine (2026-12-06, docs/fsdp2.md's example): such a run is run again, up to twice.
_GLOO_EXIT_ABORT = "terminate called without an active exception"


def _run(argv, cwd, what, timeout=600):
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    for _ in range(2):
        if result.returncode == 0 or _GLOO_EXIT_ABORT not in result.stderr:
            break
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


# Markdown links between the pages: every relative link points to a file that exists and, with a
# #fragment into a Markdown page, to one of its headings (GitHub's anchors). Links inside code are
# not links, and web addresses are not checked (the tests run offline).
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _prose_lines(text: str):
    """The lines outside fenced blocks, with inline code spans blanked."""
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield re.sub(r"(`+).*?\1", "", line)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()  # a link's text only
    kept = "".join(c for c in text if c.isalnum() or c in " -_" or unicodedata.category(c).startswith("M"))
    return kept.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = _anchor(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")  # a repeated heading gets -1, -2, ...
    return found


def _broken_links(doc: pathlib.Path) -> list[str]:
    broken = []
    for line in _prose_lines(doc.read_text()):
        for m in _LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            page = (doc.parent / path).resolve() if path else doc
            if not page.exists():
                broken.append(f"{target} (no such file)")
            elif fragment and page.suffix == ".md" and fragment not in _anchors(page):
                broken.append(f"{target} (no heading with that anchor in {page.name})")
    return broken


@pytest.mark.parametrize("doc", doc_blocks.doc_files(), ids=[str(p.relative_to(ROOT)) for p in doc_blocks.doc_files()])
def test_relative_links_resolve(doc):
    broken = _broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)} links to what does not exist: {broken}"


def test_link_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `title`: *here*\n\n[ok](#a-title-here) [ok](page.md) `[code](nowhere.md)`\n"
                    "[bad](missing.md) [bad](#nowhere) [web](https://example.com/x.md)\n")
    assert _broken_links(page) == ["missing.md (no such file)", "#nowhere (no heading with that anchor in page.md)"]


def _linked_pages(doc: pathlib.Path) -> set[pathlib.Path]:
    pages = set()
    for line in _prose_lines(doc.read_text()):
        for m in _LINK.finditer(line):
            path = m.group(1).partition("#")[0]
            if path.endswith(".md") and not re.match(r"^[a-z][a-z0-9+.-]*:", path):
                pages.add((doc.parent / path).resolve())
    return pages


def test_readme_is_a_front_page():
    """README.md stays a front page (the details live in docs/), and every page of docs/ can be reached
    from it by following links."""
    readme = ROOT / "README.md"
    assert len(readme.read_bytes()) <= 12_000, "README.md is over 12,000 bytes: move the details into docs/"
    reached, todo = {readme.resolve()}, [readme.resolve()]
    while todo:
        for page in _linked_pages(todo.pop()) - reached:
            if page.exists():
                reached.add(page)
                todo.append(page)
    unreached = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in reached)
    assert not unreached, f"docs pages no link from README.md leads to: {unreached}"
