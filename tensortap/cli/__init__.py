"""The `tensortap` command line."""
