"""``python -m mpirl.sweep``: kept at its old path; the tool is :mod:`mpirl.study.sweep`."""

import sys

from .study.sweep import *  # noqa: F403
from .study.sweep import main

if __name__ == "__main__":
    sys.exit(main())
