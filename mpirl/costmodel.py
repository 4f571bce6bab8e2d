"""``python -m mpirl.costmodel``: kept at its old path; the tool is :mod:`mpirl.study.costmodel`."""

import sys

from .study.costmodel import *  # noqa: F403
from .study.costmodel import main

if __name__ == "__main__":
    sys.exit(main())
