"""The bottom layer: configuration and environment parsing (``config``), pytrees (``tree``), bounded
and on-disk caches (``caches``), the DEBUG level (``debug``), the version. It imports nothing else of
funcgrad, so every layer above may use it."""
