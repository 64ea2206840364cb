"""The report stage: the Appendix-B reporting block, its tables and figures, and the demo."""

from .build import Report, ReportConfig, build_report, write_report

__all__ = ["Report", "ReportConfig", "build_report", "write_report"]
