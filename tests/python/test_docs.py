"""The repository is self-contained: everything the code, `--help` and the docs refer to is
in a clone.

- every `docs/...` path named in code, tests, scripts or documentation exists, and every
  "docs/design.md §N" names a section that docs/design.md has;
- every relative Markdown link resolves (to a file, and to a heading when it has #anchor);
- nothing refers to design notes that live outside the repository or to tracker numbers
  (the word for a tracker entry followed by its number): a comment says the reason itself.
"""
import pathlib
import re
import subprocess

import pytest

from conftest import REPO

TEXT_SUFFIXES = {".c", ".h", ".cu", ".py", ".sh", ".md", ".build", ".txt", ".json", ".toml"}


def tracked_files():
    """The tracked text files (git ls-files), or every file outside build folders when this
    is not a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split("\n")
        files = [REPO / f for f in out if f]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in REPO.rglob("*") if p.is_file()
                 and not any(part.startswith(("build", ".")) for part in p.relative_to(REPO).parts)]
    # this file spells the patterns it looks for
    return [f for f in files if f.suffix in TEXT_SUFFIXES and f.is_file()
            and "fixtures" not in f.relative_to(REPO).parts and f.name != "test_docs.py"]


@pytest.fixture(scope="module")
def texts():
    return {f: f.read_text(errors="replace") for f in tracked_files()}


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(md):
    out, fence = set(), False
    for line in md.read_text().split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def test_named_docs_paths_exist(texts):
    missing = []
    for f, t in texts.items():
        for m in re.finditer(r"\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_]", t):
            p = m.group(0)
            if re.match(r"-?[<{*]", t[m.end():m.end() + 2]):  # a pattern: docs/cmd/fmoe-<cmd>.md
                continue
            if not (REPO / p).exists():
                line = t.count("\n", 0, m.start()) + 1
                missing.append(f"{f.relative_to(REPO)}:{line}: {p}")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing[:30])


def test_design_sections_exist(texts):
    design = (REPO / "docs" / "design.md").read_text()
    have = set(re.findall(r"^#+ (\d+(?:\.\d+)?)[. ]", design, re.M))
    bad = []
    for f, t in texts.items():
        for m in re.finditer(r"docs/design\.md,? §(\d+(?:\.\d+)?)", t):
            if m.group(1) not in have:
                line = t.count("\n", 0, m.start()) + 1
                bad.append(f"{f.relative_to(REPO)}:{line}: §{m.group(1)}")
    assert have, "docs/design.md has no numbered sections"
    assert not bad, "sections docs/design.md does not have:\n" + "\n".join(bad[:30])


def test_markdown_links_resolve(texts):
    bad = []
    for f, t in texts.items():
        if f.suffix != ".md":
            continue
        body = re.sub(r"```.*?```", "", t, flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", body):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{f.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in headings(dest):
                bad.append(f"{f.relative_to(REPO)}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad[:30])


# Written so that this file does not match a plain grep for the same names.
FORBIDDEN = re.compile(r"DESIGN\.md|POLICIES\.md|STYLE\.md|paper[s]/|\.\./shared|"
                       r"\b[Ii]ssues? [0-9]|\bfinding [0-9]")


def test_no_references_outside_the_repository(texts):
    bad = []
    for f, t in texts.items():
        for m in FORBIDDEN.finditer(t):
            line = t.count("\n", 0, m.start()) + 1
            bad.append(f"{f.relative_to(REPO)}:{line}: {m.group(0)}")
    assert not bad, "refers outside the repository or to tracker numbers:\n" + "\n".join(bad[:30])
