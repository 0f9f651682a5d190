"""The drop-in chat widget, served to tenants' pages (docs/widget.md)."""
