import sys

from ctxproxy.proxy.cli import main

sys.exit(main())
