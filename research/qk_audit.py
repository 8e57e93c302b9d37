"""Check from a model's keys that the attention it runs is the attention its config declares.

    python research/qk_audit.py MODEL                         # a Hugging Face folder or id, a GGUF file, a run folder
    python research/qk_audit.py MODEL --factory port.py:build  # your own code builds the model from MODEL
    python research/qk_audit.py MODEL --factory port.py:build --reference MODEL   # a port against its original
"""
from utils.cli import command

from research.audit import command as audit_command

DESCRIPTION = __doc__ + """
Runs --batch windows of the offline text through the model once and checks, layer by layer: each declared q/k norm
runs, its output divided by its gain has RMS 1 and the gain is the checkpoint's; RoPE's pairing, each pair's
frequency and the θ fitted to them; the logit scale and soft-cap that reproduce the attention's output from its own
q, k and v. Each check ends "as declared", "differs: ..." or "not measurable here: ...". With --reference both are
audited on the same tokens and compared layer by layer: the first layer where they part, and the check that explains
it. Exit status 1 when anything differs or the two part, 0 when nothing does, 2 for a bad input. What each check
measures and its tolerance: docs/audit.md.
"""


def build_parser():
    return audit_command.build_parser(DESCRIPTION)


@command
def main(argv: list[str] | None = None) -> int:
    return audit_command.main(argv, DESCRIPTION)


if __name__ == "__main__":
    raise SystemExit(main())
