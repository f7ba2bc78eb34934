"""kvsp moqt package (see docs/architecture.md)."""
