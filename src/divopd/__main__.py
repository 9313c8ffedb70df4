import sys

from divopd.cli import main

sys.exit(main())
