from researcher.cli import main

raise SystemExit(main())
