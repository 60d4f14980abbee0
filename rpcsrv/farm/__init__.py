"""Farm pieces around the board: tracker registration, serving through a proxy, graceful stop, log format."""
