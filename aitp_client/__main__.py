import sys

from aitp_client.chat import main

sys.exit(main())
