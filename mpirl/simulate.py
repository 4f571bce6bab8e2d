"""``python -m mpirl.simulate``: kept at its old path; the tool is :mod:`mpirl.study.simulate`."""

import sys

from .study.simulate import *  # noqa: F403
from .study.simulate import main

if __name__ == "__main__":
    sys.exit(main())
