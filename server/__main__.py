from secure_release.server.cli import main

raise SystemExit(main())
