"""`tensortap run`: a debugged training job with real-time rules and zero script change."""
