"""The one-page offline report: context, sections and page."""

from sinkmech.report.page import Report, ReportContext, Section, build_report, figure_html, head_label, table_html

__all__ = ["build_report", "Report", "ReportContext", "Section", "figure_html", "table_html", "head_label"]
