"""Presentation of audit summaries: the terminal verdict table and the demo's HTML page."""
