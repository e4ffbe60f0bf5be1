from livefit.cli import main

raise SystemExit(main())
