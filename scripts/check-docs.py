#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md resolves.

A link's file must exist (relative to the document that links it), and a
`#fragment` must name a heading of the target Markdown file, spelled as
GitHub spells heading anchors. Links to other schemes (http, https,
mailto) are not followed. Links inside code blocks and code spans are
not links, and are skipped.

Usage: scripts/check-docs.py [REPO]   (default: the repository this script is in)
Exit status: 0 when every link resolves, 1 otherwise (each broken link is
printed as FILE:LINE: LINK: why).
"""

import os
import re
import sys

LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def slug(heading):
    """The anchor GitHub gives a heading (before de-duplication)."""
    text = heading.strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path):
    """(line number, text) of every line outside fenced code blocks."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.lstrip()
            marker = re.match(r"(`{3,}|~{3,})", stripped)
            if marker:
                if fence is None:
                    fence = marker.group(1)[0]
                    continue
                if marker.group(1)[0] == fence:
                    fence = None
                    continue
            if fence is None:
                yield number, line.rstrip("\n")


def anchors(path, cache={}):
    """Every heading anchor of the Markdown file at `path`."""
    if path not in cache:
        seen = {}
        found = set()
        for _, line in prose_lines(path):
            heading = HEADING.match(line)
            if not heading:
                continue
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        cache[path] = found
    return cache[path]


def check(doc):
    """Broken links of one document, as printable lines."""
    problems = []
    for number, line in prose_lines(doc):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            path_part, _, fragment = target.partition("#")
            resolved = doc
            if path_part:
                resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path_part))
                if not os.path.exists(resolved):
                    problems.append(f"{doc}:{number}: {target}: no such file")
                    continue
            if fragment:
                if not resolved.endswith(".md") or os.path.isdir(resolved):
                    problems.append(f"{doc}:{number}: {target}: an anchor into a file that is not Markdown")
                elif fragment not in anchors(resolved):
                    problems.append(f"{doc}:{number}: {target}: no heading with anchor #{fragment}")
    return problems


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(repo)
    docs = ["README.md"]
    if os.path.isdir("docs"):
        docs += sorted(os.path.join("docs", n) for n in os.listdir("docs") if n.endswith(".md"))
    problems = [p for doc in docs if os.path.exists(doc) for p in check(doc)]
    for problem in problems:
        print(problem)
    print(f"check-docs: {len(docs)} documents, {len(problems)} broken links", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
