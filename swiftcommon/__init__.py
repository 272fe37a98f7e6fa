"""The ground floor: what every layer of the project may import.

The environment-variable reader, logging helpers, the version and rules that both the gateway
and the worker apply (docs/architecture.md draws the layers). Contract: this package imports
nothing else of the project and never torch, so importing it costs milliseconds everywhere.
"""
