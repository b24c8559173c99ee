import sys

from enginewire.cli import main

sys.exit(main())
