"""On-disk formats: tensortap's native chunked store and the smdebug out_dir reader."""
