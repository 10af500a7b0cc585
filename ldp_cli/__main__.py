"""``python -m ldp_cli`` runs the ``ldp`` command line."""

import sys

from ldp_cli.main import main

sys.exit(main())
