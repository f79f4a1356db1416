"""Placeholder: replaced by the module owner in this session."""
