import sys

from keel.cli import main

sys.exit(main())
