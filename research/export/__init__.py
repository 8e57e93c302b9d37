"""Exporting this project's run folders to other formats (research/export_hf.py: Hugging Face transformers)."""
from research.export.hf import TARGETS, ExportError, export_run

__all__ = ["TARGETS", "ExportError", "export_run"]
