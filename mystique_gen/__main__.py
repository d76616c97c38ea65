from mystique_gen.cli import main

raise SystemExit(main())
