"""``python -m mpirl.soak``: kept at its old path; the tool is :mod:`mpirl.study.soak`."""

import sys

from .study.soak import *  # noqa: F403
from .study.soak import main

if __name__ == "__main__":
    sys.exit(main())
