import sys

from sinkmech.cli import main

sys.exit(main())
