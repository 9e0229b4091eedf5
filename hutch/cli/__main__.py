from hutch.cli import main

raise SystemExit(main())
