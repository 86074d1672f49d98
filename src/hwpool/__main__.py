"""``python -m hwpool``: the ``hwpool`` command."""

import sys

from ._cli._main import main

if __name__ == "__main__":
    sys.exit(main())
