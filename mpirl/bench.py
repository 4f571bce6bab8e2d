"""``python -m mpirl.bench``: kept at its old path; the tool is :mod:`mpirl.study.bench`."""

import sys

from .study.bench import *  # noqa: F403
from .study.bench import main

if __name__ == "__main__":
    sys.exit(main())
