"""Figures and report text, drawn from results dicts and the decisions of research.analysis. No torch.

One module per study kind (qk_norm + qk_norm_report, pilot, keys, heads) and one for the
pretrained-model inspection; each builds matplotlib Figures by file name and report text,
and never decides anything itself (verdicts, claims, taxonomies come from research.analysis).
"""
