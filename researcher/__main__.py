from secure_release.researcher.cli import main

raise SystemExit(main())
