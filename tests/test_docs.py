"""The README stays short and points at every page of docs/, and every relative link in the README and
the pages reaches a file that exists (and, with a #anchor, a heading of that file)."""

import re
from pathlib import Path

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
# [text](target) and ![alt](target), with an optional "title"; the text may hold one level of brackets
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def prose(text: str) -> str:
    """The Markdown with code blocks and code spans blanked, so nothing quoted as code counts as a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped,
    spaces as hyphens (markup such as backticks and emphasis is not part of the rendered text)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_follows_githubs_rule():
    assert slug("Benchmarks: `snakemake bench`") == "benchmarks-snakemake-bench"
    assert slug("The claims decided (`tiny_full`)") == "the-claims-decided-tiny_full"
    assert slug("CPU class and `dtype: auto`") == "cpu-class-and-dtype-auto"


def test_link_pattern_reads_links_and_images_but_not_code(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        'See [a](x.md#h), ![img](d/i.png "t") and [`code` text](y.md).\n`[not](a.md)`\n```\n[not](b.md)\n```\n'
    )
    assert links(page) == ["x.md#h", "d/i.png", "y.md"]


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in links(page):
            if SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not dest.exists() or REPO not in (dest, *dest.parents):
                broken.append(f"{where} names no file in the repository")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{where} names no heading #{anchor} of {dest.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_readme_is_short_and_links_every_page_of_docs():
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= 200
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(readme) if not SCHEME.match(t)}
    unlinked = [str(p.relative_to(REPO)) for p in PAGES[1:] if p.resolve() not in linked]
    assert PAGES[1:] and not unlinked, f"pages the README does not link: {unlinked}"


def test_the_readmes_counts_are_what_the_config_resolves_to():
    """The README's conversion and claim counts of tiny and tiny_full are the resolver's."""
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    text = " ".join((REPO / "README.md").read_text().split())
    tiny, full = (resolve(merge_preset({"preset": p}, REPO / "config")) for p in ("tiny", "tiny_full"))
    grid = re.search(r"the tiny grid is (\d+) conversion jobs, tiny_full (\d+)\)", text)
    assert grid and (int(grid[1]), int(grid[2])) == (len(tiny.conversions), len(full.conversions))
    claims = re.search(r"\((\d+) on three seeds in `tiny`, (\d+) in `tiny_full`, and one beyond them\)", text)
    papers = [c for c in full.claims if c.paper != "combined"]
    assert claims and (int(claims[1]), int(claims[2])) == (len(tiny.claims), len(papers))
    assert len(full.claims) - len(papers) == 1
    assert f"{len(tiny.claims)} claims on three seeds" in text


def test_the_commands_the_snakefile_and_readme_show_run_as_written():
    """Each `snakemake ...` command in the Snakefile's header and in the code blocks of the README and docs
    parses with Snakemake's own argument parser, names rules and config files that exist, and a run outside
    a profile gives --cores (without it Snakemake 9 refuses to run, while a dry run would not notice)."""
    import shlex

    from snakemake.cli import get_argument_parser

    workflow = [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]
    rules = set(re.findall(r"^rule (\w+):", "".join(p.read_text() for p in workflow), re.M))
    header = re.findall(r"^#\s+(snakemake [^#\n]*)", (REPO / "Snakefile").read_text(), re.M)
    # the commands to copy: a fenced line that starts with snakemake, up to a comment or a chained command
    lines = [line for page in PAGES for m in FENCE.finditer(page.read_text()) for line in m.group(0).splitlines()]
    shown = [re.split(r"\s+(?:#|&&|\|)", c)[0] for c in lines if c.startswith("snakemake ")]
    assert len(header) >= 4 and len(shown) >= 4, (header, shown)
    parser = get_argument_parser()
    for command in header + shown:
        args = parser.parse_args(shlex.split(command)[1:])
        assert args.targets or args.report, command
        for target in args.targets:
            assert target in rules or target.startswith("results/"), (command, target)
        for f in args.configfile or []:
            assert (REPO / f).is_file(), (command, f)
        if not (args.profile or args.dryrun or args.report):
            assert args.cores, f"{command!r} runs without --cores"
