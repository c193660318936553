"""(planned: see docs/architecture.md)"""
