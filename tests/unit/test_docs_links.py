"""The docs hold together: the README stays a front door (small), the map in docs/README.md
reaches every page, and every relative link — file and ``#anchor`` — lands somewhere."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    [ROOT / name for name in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md")]
    + list(DOCS.glob("*.md"))
    + [ROOT / "charts" / "llm-batch-operator" / "README.md"]
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```")


def test_the_readme_is_at_most_8_kb() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 8 * 1024, f"README.md is {size} bytes: move detail to docs/"


def test_the_docs_map_links_every_page() -> None:
    mapped = set(_LINK.findall((DOCS / "README.md").read_text(encoding="utf-8")))
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md"]
    missing = [name for name in missing if name not in mapped]
    assert not missing, f"docs/README.md does not link: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
        found.update(re.findall(r'<a id="([^"]+)"', line))
    return found


def links(page: pathlib.Path) -> list[str]:
    found: list[str] = []
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            found += _LINK.findall(line)
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
