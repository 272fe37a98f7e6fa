"""ZipCache: ``method`` (options, staging window, flushes), ``layout`` (packed block layout and
byte arithmetic, no torch), ``store`` (bit packing, packed stores, the staging area),
``ops`` (attention over packed blocks)."""
