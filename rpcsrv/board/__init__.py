"""The board: the trio server, its sessions and what a session holds (handles, memory, workspace),
the global functions clients call, and the session log records."""
