"""Report builders: summary.json, tables and plots from recorded runs (``swiftserve bench report ...``)."""
