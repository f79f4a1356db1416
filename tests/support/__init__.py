"""Test-only helpers: real local servers and fixtures that are not part of the product."""
