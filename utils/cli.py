"""The command-line parser every entry point uses, and the one wrapper of every command (`command`).

Every entry point (a script, a `python -m` module with a main) imports this module before anything heavy: from
that import on, Ctrl-C ends the process in one line with status 130, also while torch and the other libraries are
still importing, before the wrapped main has started (`_interrupted_outside_main`).

One spelling per option: words are joined by underscores, as the config fields they set are
(`--n_layers`, `--no_progress`, `--loss_margin`). A hyphenated spelling is refused with the right one
named, and an option is never matched by its prefix (`--out` does not stand for `--output`).
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from typing import Callable

from utils.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, ConfigError, Interrupted, UserError, cut, explain, shown


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with the project's habits: no prefix matching, the description printed as
    written (its examples keep their lines), and a hint when an option is spelled with hyphens."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        known = {s for a in self._actions for s in a.option_strings}
        hints = [f"{word} is spelled --{word[2:].replace('-', '_')}"
                 for word in re.findall(r"--[a-z0-9]+(?:-[a-z0-9]+)+", message)
                 if f"--{word[2:].replace('-', '_')}" in known]
        if hints:
            message = f"{message} ({'; '.join(hints)}: options join words with underscores)"
        super().error(cut(message, 500))  # argparse's messages quote a rejected value whole


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum`, else argparse's usage error (exit 2) naming the
    value found and what is expected, so that an option is checked where it is parsed, never deep in the work."""
    def parse(s: str) -> int:
        try:
            value = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, got {shown(s)}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, got {value}")
        return value
    parse.__name__ = f"whole number >= {minimum}"
    return parse


def once(why: str) -> type[argparse.Action]:
    """An argparse action that stores an option's value as argparse does, and refuses the option given a second time
    on one command line (argparse keeps the last, silently), for an option whose second use more likely means "also"
    than "instead": ConfigError '--NAME given twice (A, then B): WHY'. The first use is seen by the namespace holding
    something other than the option's default (argparse sets the default, or nothing for SUPPRESS, before parsing)."""
    class Once(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            before = getattr(namespace, self.dest, self.default)
            if before is not self.default:
                def text(v) -> str:  # as it was written: nargs' values apart, a list field's comma-separated
                    return cut((" " if self.nargs else ",").join(map(str, v)) if isinstance(v, list) else str(v), 60)
                raise ConfigError(f"{option_string} given twice ({text(before)}, then {text(values)}): {why}. Fix: "
                                  f"give {option_string} once")
            setattr(namespace, self.dest, values)
    return Once


positive_int = at_least(1)  # counts that must be at least one: steps, repeats, batch sizes, intervals
count = at_least(0)  # counts where 0 means none or all, as the option's help says


_main_started = False  # a wrapped main has begun: an interrupt after it ends is the wrapper's or Python's


def _interrupted_outside_main(kind, value, traceback) -> None:
    """sys.excepthook while an entry point starts: Ctrl-C before its main began (torch still importing) ends in
    one line and status 130, as inside main, not in a traceback of the import under way."""
    if issubclass(kind, KeyboardInterrupt) and os.environ.get("RANK", "0") == "0":
        where = "" if _main_started else " while starting (nothing was done)"
        print(f"interrupted{where}", file=sys.stderr, flush=True)
    if issubclass(kind, KeyboardInterrupt):
        try:
            sys.stdout.flush()
        except (OSError, ValueError):  # a closed or broken stdout: nothing more to say there
            pass
        os._exit(EXIT_INTERRUPTED)  # the shell's code for Ctrl-C, which Python would give only as a signal death
    _previous_hook(kind, value, traceback)


_previous_hook = sys.excepthook
if sys.excepthook is sys.__excepthook__:  # an interactive shell or a test runner with a hook of its own keeps it
    sys.excepthook = _interrupted_outside_main


def command(main: Callable | None = None, *, fix_also: str = ""):
    """The one wrapper of every command's `main` (a decorator; `@command(fix_also="pass --out DIR")` adds a way out
    to an OSError's fix). Failures end the same way in every command:

    - Ctrl-C (KeyboardInterrupt, or utils.errors.Interrupted saying what was kept): one line on stderr (rank 0's,
      under torchrun), exit status 130;
    - a user error (utils.errors.UserError and its subclasses in the layers above) or an OSError: one line
      "error: ..." (an OSError as the problem and the fix), exit status 2, as argparse's usage errors;
    - anything else is a bug and keeps its traceback.

    On success it returns what main returns."""
    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(*args, **kwargs):
            global _main_started
            _main_started = True
            try:
                return main(*args, **kwargs)
            except (KeyboardInterrupt, Interrupted) as e:
                if os.environ.get("RANK", "0") == "0":  # one line for the whole job, not one per process
                    print(str(e) if isinstance(e, Interrupted) else "interrupted", file=sys.stderr, flush=True)
                raise SystemExit(EXIT_INTERRUPTED) from None
            except (UserError, OSError) as e:
                print(f"error: {explain(e, fix_also)}", file=sys.stderr, flush=True)
                raise SystemExit(EXIT_USER_ERROR) from None
        return run
    return wrap(main) if main is not None else wrap
