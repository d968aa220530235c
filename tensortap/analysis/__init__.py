"""Analysis helpers (smdebug's import path)."""
