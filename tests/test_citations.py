"""Every citation of the paper uses the paper's own numbers, those of the table in
docs/mathematics.md ("The paper in the code").

The table lists the paper's equations, sections and appendices as LaTeX numbers its source.
Each ``eq. (N)`` / ``eqs. (N)-(M)`` and ``Sec. N`` / ``Section N`` cited in the package, the
benchmarks, the notebooks, the README and the docs must be a number of that table; a citation of
another paper ("Taylor et al.'s Sec. 4") is not the paper's and is left out.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQ = re.compile(r"\beqs?\.\s*\((\d+)\)((?:\s*(?:[-–,]|and)\s*\(\d+\))*)")
SEC = re.compile(
    r"(?<![\w.])(?:Sec\.|Secs\.|Sections?)\s*(\d+(?:\.\d+)*)((?:\s*[-–]\s*\d+(?:\.\d+)*)?)"
)
OTHER_PAPER = re.compile(r"et al\.(?:'s|,)\s*$")


def _table():
    text = (ROOT / "docs" / "mathematics.md").read_text(encoding="utf-8")
    section = text.split("## The paper in the code", 1)[1].split("\n## ", 1)[0]
    first = [
        line.split("|")[1]
        for line in section.splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]
    return " ; ".join(first)


def _equations(text):
    cited = set()
    for match in EQ.finditer(text):
        numbers = [int(match.group(1))] + [int(n) for n in re.findall(r"\((\d+)\)", match.group(2))]
        if re.search(r"[-–]", match.group(2)):  # a range (N)-(M)
            numbers = list(range(numbers[0], numbers[-1] + 1))
        cited.update(numbers)
    return cited


def _sections(text):
    cited = set()
    for match in SEC.finditer(text):
        if OTHER_PAPER.search(text[max(0, match.start() - 12) : match.start()]):
            continue
        cited.add(match.group(1))
        if match.group(2):
            cited.add(re.sub(r"^\s*[-–]\s*", "", match.group(2)))
    return cited


def _sources():
    paths = list((ROOT / "fenchel_cvx").rglob("*.py")) + list((ROOT / "benchmarks").glob("*.py"))
    paths += list((ROOT / "notebooks").glob("[0-9][0-9]_*.py")) + list((ROOT / "docs").glob("*.md"))
    return sorted(paths) + [ROOT / "README.md"]


def _text(path):
    """The file's text with line breaks (and a comment's leading #) joined to spaces."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(encoding="utf-8"))


def test_the_table_numbers_the_papers_equations_and_sections():
    table = _table()
    assert _equations(table) == set(range(1, 25))  # (1) .. (24), every one
    assert {
        "3",
        "4.1",
        "4.2",
        "4.3",
        "4.4",
        "4.5",
        "4.5.1",
        "4.5.2",
        "5.1",
        "5.2",
        "5.3",
    } <= _sections(table)
    for name in (
        "Theorem 1",
        "Algorithm 1",
        "Algorithm 2",
        "Appendix A",
        "Appendix B",
        "Appendix C",
        "Figure 1",
        "Figure 4",
    ):
        assert name in table, name


def test_the_patterns_read_each_form_of_citation():
    assert _equations("the paper's eqs. (4)-(7) and eq. (13)") == {4, 5, 6, 7, 13}
    assert _equations("eqs. (17), (19) and eq.\u00a0(2)") == {17, 19, 2}
    assert _sections("Sec. 4.5.1; Section 5; Secs. 5.2-5.3") == {"4.5.1", "5", "5.2", "5.3"}
    assert _sections("Taylor et al.'s Sec. 4") == set()


def test_every_citation_is_a_number_of_the_table():
    table = _table()
    equations, sections = _equations(table), _sections(table)
    bad = []
    for path in _sources():
        text = _text(path)
        rel = path.relative_to(ROOT)
        bad += [f"{rel}: eq. ({n})" for n in sorted(_equations(text) - equations)]
        for sec in sorted(_sections(text) - sections):
            if not any(
                s == sec or s.startswith(sec + ".") for s in sections
            ):  # "Sec. 4": 4.x exists
                bad.append(f"{rel}: Sec. {sec}")
    assert not bad, "citations not in docs/mathematics.md's table: " + ", ".join(bad)
