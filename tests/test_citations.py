"""Every citation of the paper uses the paper's own numbers, those of the table in
docs/mathematics.md ("The paper in the code").

The table lists the paper's equations, sections and appendices as LaTeX numbers its source.
Each ``eq. (N)`` / ``eqs. (N)-(M)`` and ``Sec. N`` / ``Section N`` cited in the package, the
benchmarks, the notebooks, the README and the docs must be a number of that table; a citation of
another paper ("Taylor et al.'s Sec. 4") is not the paper's and is left out.

Each citation of an equation must also say what that equation is: the text around it names a
word of the table's last column for every equation it cites (its own row), or, for several at
once, a word of a row that holds them all (the blocks, eqs. (14)-(20)).
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


# --- what each citation says ----------------------------------------------------------------
#: the characters around a citation that must name its subject (its sentence, about)
BEFORE, AFTER = 250, 150


def _rows():
    """``[(equations, words)]``: each row of the table that numbers equations, its last
    column's words as patterns (case-insensitive; ``_l`` any subscript)."""
    text = (ROOT / "docs" / "mathematics.md").read_text(encoding="utf-8")
    section = text.split("## The paper in the code", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]  # (not at an escaped |)
        if len(cells) == 4 and _equations(cells[0]):
            words = [w.strip() for w in cells[3].split(",") if w.strip()]
            rows.append((_equations(cells[0]), [_pattern(w) for w in words]))
    return rows


def _pattern(word):
    escaped = re.escape(word).replace(r"_l", r"_(?:l|L|\d+|\{[^}]*\}|[a-z])")
    return re.compile(escaped, re.IGNORECASE)


def unsaid(text, rows):
    """The citations of ``text`` whose context does not say what they cite: for every cited
    equation a word of its own row (of at most two equations), or, for several, a word of a
    row that holds them all. -> ``[(cited, the context)]``."""
    out = []
    for match in EQ.finditer(text):
        cited = _equations(match.group(0))
        context = text[max(0, match.start() - BEFORE) : match.end() + AFTER]

        said = [any(p.search(context) for p in words) for _, words in rows]
        whole = any(cited <= eqs and s for (eqs, _), s in zip(rows, said))
        each = all(
            any(e in eqs and len(eqs) <= 2 and s for (eqs, _), s in zip(rows, said)) for e in cited
        )
        if not (whole or each):
            out.append((sorted(cited), context))
    return out


def test_every_citation_says_what_it_cites():
    rows = _rows()
    bad = [
        f"{path.relative_to(ROOT)}: eqs. {cited} in '...{context}...'"
        for path in _sources()
        for cited, context in unsaid(_text(path), rows)
    ]
    assert not bad, "citations whose sentence names none of the subject's words:\n" + "\n".join(bad)


def test_a_citation_of_another_subject_fails():
    rows = _rows()
    # the X-blocks cited as the W-blocks' and Appendix A's scaling's equations
    wrong = "each solve of the blocks (eqs. (19)-(21), as fast.xblocks solves them) traces"
    assert unsaid(wrong, rows)
    assert not unsaid("the hidden X-block (eq. (14)) and the W-blocks (eqs. (17)-(20))", rows)
    assert unsaid("the last loss (eq. (3)) of the hidden X-block, eq. (14),", rows) == []
    assert unsaid("the proximal term of eq. (21)", rows)
