"""``python -m lsmdb`` runs the ``lsmdb`` command."""

import sys

from .cli import main

sys.exit(main())
