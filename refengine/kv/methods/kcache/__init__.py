"""KCache: ``method`` (which slots keep V on the host), ``ops`` (the host V store and top-N
decode attention), ``staging`` (reusable pinned staging buffers and the copies' order)."""
