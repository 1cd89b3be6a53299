"""The ``cstream`` command.

    cstream ckpt inspect FILE          what a checkpoint holds
    cstream ckpt convert FILE.h5 FILE.pt   to PyTorch's pickle format
    cstream run / sweep / report       experiments and their summaries
    cstream trace RUN_DIR              a run's timeline (Chrome/Perfetto trace)

Other command groups register themselves in :data:`SUBCOMMANDS` (name -> module path); each module
has ``add_parser(subparsers)`` which sets ``func(args) -> int`` on its parser.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import signal
import sys

from cstream_tools.cli_errors import CLIError

SUBCOMMANDS = {
    "ckpt": "cstream_tools.cli_ckpt",
    "run": "cstream_tools.cli_run",  # run, sweep and report
    "trace": "cstream_tools.cli_trace",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cstream", description="cstream: the Cerebras PyTorch API, runnable.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv=None) -> int:
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>`: every thread's stack on stderr
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (AttributeError, OSError, ValueError):  # stderr is not a file (main() in tests)
            pass
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CLIError as e:
        print(f"cstream {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TypeError) as e:
        message = " ".join(str(e).split())
        print(f"cstream {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # python -m cstream_tools.cli: run the importable module (one CLIError class)
    from cstream_tools.cli import main as _main

    sys.exit(_main())
