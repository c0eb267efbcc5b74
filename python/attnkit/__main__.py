"""``python -m attnkit info|verify|bench [options]``: the attnkit command-line tool, run in-process."""

import sys

from . import _attnkit


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not _attnkit.has_cli:
        print("attnkit: this build has no command-line tool (configure with -DATTNKIT_BUILD_CLI=ON)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    return _attnkit._cli(["python -m attnkit", *args])


if __name__ == "__main__":
    sys.exit(main())
