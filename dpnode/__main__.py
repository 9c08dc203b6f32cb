"""``python -m dpnode``: the ``dpnode`` command (see :mod:`dpnode.node.cli`)."""

import sys

from dpnode.node.cli import main

sys.exit(main())
