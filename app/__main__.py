from secure_release.cli import main

raise SystemExit(main())
