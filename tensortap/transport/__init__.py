"""How saved tensors travel from the training thread to the writer: the shared-memory ring and the writer
process that reads it (`process_writer`), and the copies into the ring (`copy`, with the optional C helper
`_streamcopy`). The ring's layout is specified in docs/transport.md. The on-disk format is `tensortap.format`'s.
"""

#: the environment of a process tensortap starts beside training (the writer process, rule workers): one thread for
#: every library numpy may carry as its BLAS. Such a process does little or no linear algebra; a BLAS pool would
#: start with numpy's import, one thread per core, each spinning ~0.1 s for work that never comes, beside the
#: training thread.
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "BLIS_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1"}
