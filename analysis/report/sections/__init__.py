"""The report's sections, one per file: each builds its ``ReportSection`` from a ``ReportContext``."""
