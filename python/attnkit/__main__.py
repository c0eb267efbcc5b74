"""``attnkit info|verify|bench|gqa [options]`` (also ``python -m attnkit ...``): the attnkit command-line tool, run
in-process. The case files ship inside the package (``attnkit/cases``); ``--cases DIR`` picks others."""

import os
import sys

from . import _attnkit

# Subcommands that read the case list.
_CASE_COMMANDS = ("info", "verify", "bench")


def cases_dir() -> str:
    """The case files installed with the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")


def _with_cases(args):
    if not args or args[0] not in _CASE_COMMANDS or any(a == "--cases" or a.startswith("--cases=") for a in args):
        return args
    if not os.path.isdir(cases_dir()):
        return args  # a build without them (an in-tree build): the tool's own default
    return [args[0], "--cases", cases_dir(), *args[1:]]


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not _attnkit.has_cli:
        print("attnkit: this build has no command-line tool (CLI11, nlohmann-json and OpenBLAS were not found when "
              "it was built: on Debian/Ubuntu apt-get install libcli11-dev nlohmann-json3-dev libopenblas-dev, then "
              "reinstall attnkit)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    prog = "attnkit" if argv is None and os.path.basename(sys.argv[0]) == "attnkit" else "python -m attnkit"
    plot_path = None
    if args and args[0] == "bench":
        from . import _plot

        args, plot_path = _plot.split_plot_option(args)
        if plot_path is not None:
            _plot.require_matplotlib()  # before minutes of timing
    try:
        if plot_path is None:
            return _attnkit._cli([prog, *_with_cases(args)])
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            json_path = os.path.join(tmp, "bench.json")
            rc = _attnkit._cli([prog, *_with_cases(args), "--json", json_path])
            if os.path.exists(json_path):
                _plot.plot(json_path, plot_path)
                print(f"wrote {plot_path}")
            return rc
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
