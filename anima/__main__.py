from anima.launch import main

raise SystemExit(main())
