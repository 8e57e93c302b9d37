"""The command-line parser every entry point uses, and the one wrapper of every command (`command`).

Every entry point (a script, a `python -m` module with a main) imports this module before anything heavy: from
that import on, Ctrl-C ends the process in one line with status 130, also while torch and the other libraries are
still importing, before the wrapped main has started (`_interrupted_outside_main`).

One spelling per option: words are joined by underscores, as the config fields they set are
(`--n_layers`, `--no_progress`, `--loss_margin`). A hyphenated spelling is refused with the right one
named, and an option is never matched by its prefix (`--out` does not stand for `--output`). An option is given
once: a second use is refused in one line (argparse keeps the last without a word), unless it appends.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import re
import sys
from typing import Callable

from utils.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, ConfigError, Interrupted, UserError, cut, explain, shown


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with the project's habits: no prefix matching, the description printed as
    written (its examples keep their lines), a hint when an option is spelled with hyphens, and every option that
    stores (a value, a list after one option, a switch) refused when given twice (`once`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        # the registry argument groups share: every storing action of this parser is given once
        for name, cls in (("store", argparse._StoreAction), ("store_const", argparse._StoreConstAction),
                          ("store_true", argparse._StoreTrueAction), ("store_false", argparse._StoreFalseAction)):
            self.register("action", name, _given_once(cls, _ONE_VALUE))
        self.register("action", None, self._registry_get("action", "store"))

    def parse_known_args(self, args=None, namespace=None):
        self.given_options: dict[str, tuple[str, object]] = {}  # dest -> (option, values) of this parse (`once`)
        return super().parse_known_args(args, namespace)

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


def positive_number(s: str) -> float:
    """An argparse type: a finite number above 0 (seconds, rates, shares of a resource), else argparse's usage error
    (exit 2). nan and inf are refused here: float() reads them, no comparison refuses nan, and a JSON file that records
    one is refused by strict parsers."""
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {shown(s)}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {shown(s)}")
    return value


positive_number.__name__ = "positive number"


_ONE_VALUE = "it takes one value"  # the reason of an option given twice that says none of its own


def _given_once(base: type[argparse.Action], why: str) -> type[argparse.Action]:
    """`base` (argparse's store, store_const, store_true, ... action) refusing its option given a second time on one
    command line of an ArgumentParser (`once`). A use is seen in the parse's record, not in the namespace: a value
    equal to the default (`--steps 5` where 5 is the default) is a use too."""
    class Once(base):
        def __call__(self, parser, namespace, values, option_string=None):
            given = parser.given_options  # this parse's (ArgumentParser.parse_known_args)
            if self.dest in given:
                raise ConfigError(_twice(self, *given[self.dest], option_string, values, why))
            given[self.dest] = (option_string, values)
            super().__call__(parser, namespace, values, option_string)
    Once.__name__ = f"Once{base.__name__}"
    return Once


def _twice(action: argparse.Action, first: str, before, second: str, values, why: str) -> str:
    """ConfigError's message for an option given twice: both uses, as they were written, the reason and the fix."""
    def text(v) -> str:  # as written: nargs' values apart, a list field's comma-separated, a bool in lower case
        word = lambda x: str(x).lower() if isinstance(x, bool) else str(x)  # noqa: E731
        return cut((" " if action.nargs else ",").join(map(word, v)) if isinstance(v, list) else word(v), 60)
    shown_values = f" ({text(before)}, then {text(values)})" if action.nargs != 0 else ""
    what = f"{second} given twice" if first == second else f"{first} and {second} both given"
    if why == _ONE_VALUE and action.nargs == 0:
        why = "it is a switch"
    elif why == _ONE_VALUE and action.nargs not in (None, "?", 1):
        why = f"its values go after one {second}"
    return f"{what}{shown_values}: {why}. Fix: " + (f"give {second} once" if first == second else "give one of them")


def once(why: str) -> type[argparse.Action]:
    """An argparse action that stores an option's value as argparse does, and refuses the option given a second time
    on one command line (argparse keeps the last, silently): ConfigError '--NAME given twice (A, then B): WHY. Fix:
    give --NAME once'. Every storing option of ArgumentParser is given once with the reason "it takes one value";
    `once(why)` gives the reason of an option whose second use more likely means "also" than "instead"."""
    return _given_once(argparse._StoreAction, why)


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
