from anima.cli import main

raise SystemExit(main())
