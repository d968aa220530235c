"""How saved tensors travel from the training thread to the writer: the shared-memory ring and the writer
process that reads it (`process_writer`), and the copies into the ring (`copy`, with the optional C helper
`_streamcopy`). The ring's layout is specified in docs/transport.md. The on-disk format is `tensortap.format`'s.
"""
