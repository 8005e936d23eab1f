"""Every relative link of the results files and READMEs resolves, and results/raw/ holds only what they cite.

The Markdown files checked: benchmarks/results/*.md, the repository's README.md and benchmarks/lab/README.md.
A link is `[text](target)` or `![alt](target)` outside code spans and fenced blocks; a target with a scheme
(https:, mailto:) is not checked. A relative target must name a file or folder inside the repository, and a
`#fragment` into a Markdown file must name one of its headings (GitHub's anchor of the heading text) or an
explicit `<a id="...">`. Every file under benchmarks/results/raw/ must be cited by one of these links, itself
or through a folder that holds it: raw outputs nothing cites are history, which git keeps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
RAW = RESULTS / "raw"
MARKDOWN = sorted(RESULTS.glob("*.md")) + [REPO / "README.md", REPO / "benchmarks" / "lab" / "README.md"]

FENCE_RE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN_RE = re.compile(r"`[^`\n]*`")
LINK_RE = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
HTML_ANCHOR_RE = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, code spans and fenced blocks left out."""
    text = CODE_SPAN_RE.sub("", FENCE_RE.sub("", path.read_text(encoding="utf-8")))
    return LINK_RE.findall(text)


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (word characters, spaces, hyphens kept),
    each space a hyphen."""
    text = LINK_RE.sub(lambda m: m.group(0)[m.group(0).index("[") + 1:m.group(0).index("]")], heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a fragment may name in a Markdown file; a repeated heading's anchor gets -1, -2, ..."""
    text = FENCE_RE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR_RE.findall(text))
    for heading in HEADING_RE.findall(text):
        base = github_anchor(heading)
        count = seen.get(base, 0)
        out.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return out


def resolve(source: Path, target: str) -> tuple[Path, str]:
    """The path and fragment a relative link of `source` names."""
    path, _, fragment = target.partition("#")
    return ((source.parent / path).resolve() if path else source), fragment


def relative_links() -> list[tuple[Path, str]]:
    return [(md, target) for md in MARKDOWN for target in links(md) if not SCHEME_RE.match(target)]


@pytest.mark.parametrize("md", MARKDOWN, ids=[str(p.relative_to(REPO)) for p in MARKDOWN])
def test_relative_links_resolve(md):
    broken = []
    for target in links(md):
        if SCHEME_RE.match(target):
            continue
        path, fragment = resolve(md, target)
        if not path.is_relative_to(REPO) or not path.exists():
            broken.append(f"{target}: no such file in the repository")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading or anchor '{fragment}' in {path.relative_to(REPO)}")
    assert not broken, f"{md.relative_to(REPO)}:\n" + "\n".join(broken)


def test_raw_outputs_are_all_cited():
    cited = [path for md, target in relative_links() for path in [resolve(md, target)[0]]
             if path.is_relative_to(RAW) and path != RAW]  # a link to raw/ itself cites no output
    uncited = [p.relative_to(REPO) for p in sorted(RAW.rglob("*"))
               if p.is_file() and not any(p == c or c in p.parents for c in cited)]
    assert not uncited, (f"{len(uncited)} files under benchmarks/results/raw/ are cited by no results file "
                         f"or README (cite them, or git rm them: git keeps history): "
                         + ", ".join(str(p) for p in uncited[:20]))


def test_anchor_rules():
    """The anchor rule and the link parser on cases of their own (the checks above cannot pass vacuously)."""
    assert github_anchor("The d=128 defect: why score dots run as 64-deep halves") == \
        "the-d128-defect-why-score-dots-run-as-64-deep-halves"
    assert github_anchor("Tried, not kept") == "tried-not-kept"
    assert github_anchor("Time and the 16 GiB budget (graph path)") == "time-and-the-16-gib-budget-graph-path"
    assert github_anchor("`generate` of one clip") == "generate-of-one-clip"
    text = "a [x](a.md#b) `[y](skip.md)` ![p](img.png) [w](https://e.org)\n```\n[z](fenced.md)\n```\n"
    assert LINK_RE.findall(CODE_SPAN_RE.sub("", FENCE_RE.sub("", text))) == ["a.md#b", "img.png", "https://e.org"]
