import sys

if sys.argv[1:2] == ["--reap-engine"]:
    # The reaper helper mode (app.supervisor.reaper): it skips the app's other imports. A frozen bundle
    # runs this file as its entry point, so it starts its reapers the same way.
    from app.supervisor.reaper import main as reap_main

    raise SystemExit(reap_main(sys.argv[2:]))

from app.cli import main

raise SystemExit(main())
