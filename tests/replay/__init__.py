"""Kernel replay: the corpus (corpus.py), its renderer (record.py) and the recordings per device."""
