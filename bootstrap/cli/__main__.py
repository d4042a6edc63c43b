"""``python -m bootstrap.cli``: the ``nodegate`` command."""

import sys

from bootstrap.cli.main import main

sys.exit(main())
