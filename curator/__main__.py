from secure_release.curator.cli import main

raise SystemExit(main())
