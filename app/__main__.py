import os
import sys

if getattr(sys, "frozen", False) and sys.platform.startswith("linux"):
    # PyInstaller's bootloader put the bundle's own libraries first on LD_LIBRARY_PATH (keeping the
    # user's in LD_LIBRARY_PATH_ORIG). This process has loaded them already; engines, uv and pip must
    # start with the user's libraries, not the bundle's libstdc++, OpenSSL or libpython.
    original = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        os.environ.pop("LD_LIBRARY_PATH", None)
    else:
        os.environ["LD_LIBRARY_PATH"] = original

if sys.argv[1:2] == ["--reap-engine"]:
    # The reaper helper mode (app.supervisor.reaper): it skips the app's other imports. A frozen bundle
    # runs this file as its entry point, so it starts its reapers the same way.
    from app.supervisor.reaper import main as reap_main

    raise SystemExit(reap_main(sys.argv[2:]))

from app.cli import main

raise SystemExit(main())
