"""What verification reports: one row per compared activation, the verdict, and the float64 re-run."""

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class VerifyRow:
    """One compared activation: differences and the tolerance it was held to."""

    hook: str
    max_abs_diff: float
    mean_abs_diff: float
    tolerance: float
    ok: bool


@dataclass
class VerifyReport:
    """The result of ``verify_against_hf``; ``print(report)`` shows it as a table."""

    rows: list[VerifyRow]
    dtype: torch.dtype
    atol: float
    rtol: float
    shape: tuple[int, ...]
    skipped: list[str] = field(default_factory=list)
    processing: list[str] = field(default_factory=list)
    float64: Optional["VerifyReport"] = None
    real_positions: int | None = None  # positions compared when padding is excluded (None: no padding)

    @property
    def within_tolerance(self) -> bool:
        """Every compared hook within tolerance at this report's dtype."""
        return all(row.ok for row in self.rows)

    @property
    def ok(self) -> bool:
        """Within tolerance, or (if not) the float64 re-run is: the differences are float noise."""
        return self.within_tolerance or (self.float64 is not None and self.float64.ok)

    @property
    def first_divergence(self) -> str | None:
        """The first hook, in forward order, beyond tolerance at this report's dtype (None if none)."""
        return next((row.hook for row in self.rows if not row.ok), None)

    @property
    def logits_max_diff(self) -> float | None:
        """Max absolute difference of the logits (log-probs after ``center_unembed``), if compared."""
        return next((row.max_abs_diff for row in self.rows if row.hook in ("logits", "log_probs")), None)

    def __getitem__(self, hook: str) -> VerifyRow:
        for row in self.rows:
            if row.hook == hook:
                return row
        raise KeyError(f"no row for {hook!r} in this report; rows: {[row.hook for row in self.rows]}")

    def verdict(self) -> str:
        if self.within_tolerance:
            return f"MATCH: all {len(self.rows)} compared activations within tolerance"
        if self.ok:
            return (
                f"MATCH up to float noise: {self.first_divergence} is beyond the {_dtype_name(self.dtype)} "
                "tolerance, but the float64 re-run agrees"
            )
        where = self.float64.first_divergence if self.float64 is not None else self.first_divergence
        return f"MISMATCH: first divergence at {where}" + (
            " (confirmed in float64)" if self.float64 is not None else ""
        )

    def __str__(self) -> str:
        return "\n".join(self.table_lines(with_float64=True))

    def table_lines(self, with_float64: bool = False) -> list[str]:
        """The table as lines: a header, one line per hook, then the float64 re-run and the verdict."""
        width = max([len("hook")] + [len(row.hook) for row in self.rows])
        n_positions = self.shape[0] * self.shape[1]
        padding = (
            ""
            if self.real_positions is None
            else f" ({self.real_positions} of {n_positions} positions real; padding excluded)"
        )
        lines = [
            f"verify against Hugging Face: tokens {list(self.shape)}{padding}, {_dtype_name(self.dtype)}, "
            f"ok when max|diff| <= {self.atol:.0e} + {self.rtol:.0e} * max|hf|",
        ]
        if self.processing:
            lines.append(f"weight processing applied: {self.processing}; skipped {len(self.skipped)} changed hooks")
        lines.append(f"{'hook':<{width}}  {'max |diff|':>10}  {'mean |diff|':>11}  {'tolerance':>9}  ok")
        for row in self.rows:
            mark = "ok" if row.ok else "FAIL"
            lines.append(
                f"{row.hook:<{width}}  {row.max_abs_diff:>10.2e}  {row.mean_abs_diff:>11.2e}  "
                f"{row.tolerance:>9.1e}  {mark}"
            )
        if with_float64:
            if self.float64 is not None:
                lines += ["", "float64 re-run:"] + ["  " + line for line in self.float64.table_lines()]
            lines.append(self.verdict())
        return lines


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


__all__ = ["VerifyReport", "VerifyRow"]
