"""The one-page offline report: context, sections and page."""

from sinkmech.report.context import ReportContext, Section, figure_html, head_label, table_html
from sinkmech.report.page import Report, build_report
from sinkmech.report.sections import SECTIONS

__all__ = ["build_report", "Report", "ReportContext", "Section", "SECTIONS", "figure_html", "table_html", "head_label"]
