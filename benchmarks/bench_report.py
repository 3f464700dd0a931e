"""Markdown tables for the benchmark report, and the block of docs/performance.md they replace."""

from dataclasses import dataclass, field
from pathlib import Path

DOCS_START = "<!-- benchmark report: start (written by benchmarks/bench.py --update-docs) -->"
DOCS_END = "<!-- benchmark report: end -->"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.title!r} has {len(self.columns)} columns, received a row of {len(cells)}")
        self.rows.append([str(cell) for cell in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows}


def markdown_report(tables: list[Table], context: dict[str, str]) -> str:
    header = ["## Benchmark report", ""] + [f"- {key}: {value}" for key, value in context.items()]
    return "\n".join(header + [""] + [table.markdown() + "\n" for table in tables])


def update_docs(path: Path, report: str) -> None:
    """Replace the report block of ``path`` (between the two markers) with ``report``."""
    text = path.read_text(encoding="utf-8")
    if DOCS_START not in text or DOCS_END not in text:
        raise ValueError(f"{path} has no report block: expected the lines {DOCS_START!r} and {DOCS_END!r}")
    before, rest = text.split(DOCS_START, 1)
    _, after = rest.split(DOCS_END, 1)
    path.write_text(before + DOCS_START + "\n" + report.strip() + "\n" + DOCS_END + after, encoding="utf-8")
