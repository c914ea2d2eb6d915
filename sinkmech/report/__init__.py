"""The one-page offline report: context, sections and page."""

from sinkmech.report.page import Report, ReportContext, Section, build_report

__all__ = ["build_report", "Report", "ReportContext", "Section"]
