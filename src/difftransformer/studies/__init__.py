"""What the two studies (``retrieval/``, ``lmsweep/``) share, below both so that neither imports the other: the lr
choice over a grid with bounded widening (``lr.py``), a study config's checks and dict round trip (``config.py``),
the command-line helpers and the rounding file (``cli.py``), the protocol's deviations and the plots' set-up
(``report.py``). Each study passes its own pre-registered rule where the two differ (e.g. how an lr wins)."""
